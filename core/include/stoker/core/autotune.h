// SPDX-License-Identifier: Apache-2.0
// Options of the pipeline's autotuner (PipelineBuilder::autotune).
#pragma once

#include <chrono>

namespace stoker {

/// The autotuner moves threads between the map and flat_map stages while the pipeline runs
/// (those whose StageOptions::autotune is on),
/// within a budget: at every `interval` it measures each such stage's busy share (the time its
/// bodies ran, over its threads: the inspector's busy %) and gives a thread to the busiest one
/// (at least 85% busy) from the stage that can best spare one (still at most 70% busy with one
/// thread fewer), or from the budget's unused threads. A move is made only when the same move
/// is called for at two decisions in a row, and the decision after a move is skipped (its
/// measurement straddles the move). Each move is logged, with its evidence, and written to the
/// occupancy log as an `autotune` record. A tuned stage's `threads` is where it starts: its
/// function may be called by up to the budget's bodies at once (StageOptions::copy_per_body).
struct AutotuneOptions {
  /// The budget: the pipeline's threads, and the most the tuned stages may have in all; 0 = the
  /// pipeline's threads as set (one per core by default).
  int threads = 0;
  std::chrono::milliseconds interval{250};  ///< between decisions
};

}  // namespace stoker
