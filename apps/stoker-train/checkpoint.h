// SPDX-License-Identifier: Apache-2.0
// stoker-train's checkpoints: the model, its optimizer, where the schedule and the epoch stand,
// and the pipeline's state, in one file that is replaced atomically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "stoker/cluster/elastic.h"
#include "stoker/core/state.h"

namespace stoker::train {

struct TrainOptions;

/// DIR/checkpoint: one line of JSON (the counts, the options that must match, every rank's
/// pipeline state and how the epoch they are in was shared among the ranks), a newline, then
/// the model's bytes (Mlp::save), which are the same on every rank. Rank 0 writes it. A job of
/// as many ranks resumes each rank's own pipeline state; a job of another number shares out
/// what the states say is left of the epoch (cluster::EpochPlan).
struct Checkpoint {
  std::uint64_t step = 0;                  ///< training steps done
  std::uint64_t samples = 0, batches = 0;  ///< of the epoch the pipelines are in, per rank
  /// The options a resumed run must share, by their command-line names.
  std::map<std::string, std::string> options;
  std::vector<PipelineState> pipelines;  ///< one per rank, in rank order
  std::vector<std::byte> model;
  /// How the epoch of `pipelines` was shared among the ranks; a version 1 checkpoint (none):
  /// as ShuffledShard shares it.
  std::optional<cluster::EpochPlan> plan;
  /// Which samples the run had trained on (TrainReport::digest: every epoch's, that of
  /// `pipelines`' epoch so far included) and, of that, the epoch's. None in checkpoints before
  /// version 3.
  struct Digests {
    std::uint64_t run = 0, epoch = 0;
  };
  std::optional<Digests> digests;

  /// What a checkpoint records of the run, which a run that resumes it must share at any world
  /// size: the options of `o` that decide it, by their command-line names, and "training data",
  /// `data` (what the training set is: a hash of every byte of the IDX files, or of every image
  /// file's name and label).
  static std::map<std::string, std::string> options_of(const TrainOptions& o, const std::string& data);
  /// Throws std::invalid_argument naming the first of them that differs from the checkpoint's
  /// (of those a checkpoint before version 3 did not record: none).
  void check_options(const TrainOptions& o, const std::string& data, const std::filesystem::path& from) const;
  /// A hash of the whole file as read: two ranks that resume other checkpoints differ in it.
  std::uint64_t file_hash = 0;
  /// The format's version this stoker-train writes (it reads 1 to this).
  static constexpr int kLatest = 3;
  /// The file's, once load() has read it.
  int version = kLatest;

  /// Writes DIR/checkpoint (creating DIR) through a file beside it, renamed over it at the end:
  /// a crash while writing leaves the previous checkpoint whole.
  void save(const std::filesystem::path& dir) const;
  /// Reads DIR/checkpoint; throws StateError naming the file and what is wrong with it.
  static Checkpoint load(const std::filesystem::path& dir);
  static std::filesystem::path file(const std::filesystem::path& dir) { return dir / "checkpoint"; }

 private:
  nlohmann::json pipeline_list() const;
};

}  // namespace stoker::train
