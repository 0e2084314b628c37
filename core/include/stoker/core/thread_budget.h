// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <memory>

namespace stoker {

namespace detail {
class PipelineCore;
}

/// One thread budget for several pipelines (PipelineOptions::budget): together they never run
/// more than `threads()` stage bodies at once, whatever their own threads. A training and an
/// evaluation pipeline, or two data sources, share a machine this way rather than taking one
/// core each per pipeline.
///
/// A body holds one of the budget's turns while it computes. It gives the turn back while it
/// waits: for room downstream (a flat_map call whose outputs fill a chunk), and inside
/// BlockedTime (a pool's free buffer, a device), so that a pipeline nobody consumes never holds
/// the turns another pipeline needs. Waiting turns are handed out first come, first served, and
/// a body that computes hands its turn on after each chunk while another waits. Stopping one
/// pipeline wakes its own waiting bodies only; the others run on.
///
/// Each pipeline keeps its own threads (PipelineOptions::threads; one per turn of the budget by
/// default), its occupancy, stop and resume. oneTBB work that a stage function starts inside
/// itself (a parallel_for) runs on its pipeline's idle threads, not counted against the budget.
/// A stage function that waits for another stage should say so with BlockedTime.
///
/// Thread-safe; shared by std::shared_ptr, and lives as long as its last pipeline.
class ThreadBudget {
 public:
  /// `threads` from 1 up; 0 = one per core.
  explicit ThreadBudget(int threads = 0);
  ~ThreadBudget();
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;

  /// Stage bodies that may run at once, in all the pipelines that share it.
  int threads() const noexcept;
  /// Those running now (holding a turn), and those waiting for one: a moment's view.
  int running() const noexcept;
  int waiting() const noexcept;

 private:
  friend class detail::PipelineCore;
  struct Turns;
  std::unique_ptr<Turns> turns_;
};

}  // namespace stoker
