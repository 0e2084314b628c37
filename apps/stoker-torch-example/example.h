// SPDX-License-Identifier: Apache-2.0
// stoker-torch-example's run, apart from its command line: a small CNN trained with libtorch
// on Fashion-MNIST crops, fed either by a stoker pipeline whose batches reach libtorch through
// DLPack without a copy, or by libtorch's own DataLoader doing the same job. See docs/torch.md.
// This header includes nothing from libtorch, so that the command line compiles without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "stoker/stages/idx.h"

namespace stoker::torch_example {

/// The reference job's geometry (docs/benchmarks.md): 5 random 24x24 crops of each 28x28
/// image, each mirrored left-right with probability 0.5, normalized as (x/255 - mean)/std.
inline constexpr std::uint32_t kCropSide = 24;
inline constexpr int kCropsPerImage = 5;
inline constexpr double kMirrorP = 0.5;
inline constexpr float kMean = 0.2860f, kStd = 0.3530f;
inline constexpr std::size_t kShuffleCapacity = 10'000, kMinAfterDequeue = 2'000;

struct ExampleOptions {
  std::string data = kFashionMnistDir;  ///< holds train-* and t10k-* IDX files
  std::string loader = "stoker";        ///< stoker or torch
  /// stoker: the pipeline's threads (and the bodies of its crop and collate stages), at least 1;
  /// torch: the DataLoader's worker threads, 0 loading on the training thread.
  int workers = 2;
  std::uint32_t epochs = 1;
  std::size_t batch_size = 255;
  std::size_t images = 0;       ///< use only the first N training images; 0 = all
  double learning_rate = 1e-3;  ///< Adam's
  std::uint64_t seed = 1;       ///< crops, mirrors, shuffles and initial weights
  std::string steps = "train";  ///< train, or none: only touch each batch (the loader alone)
  int intra_op_threads = 0;     ///< libtorch's intra-op threads; 0 = its own default
};

/// Throws std::invalid_argument naming the first bad option.
void validate(const ExampleOptions& options);

struct EpochReport {
  std::uint32_t epoch = 0;  ///< from 1
  std::uint64_t samples = 0, batches = 0;
  double seconds = 0;         ///< from the first batch asked for to the last step done
  double loss = 0;            ///< mean training cross-entropy (0 with --steps none)
  double train_accuracy = 0;  ///< on the training crops as they were trained on
  double samples_per_s() const { return seconds > 0 ? static_cast<double>(samples) / seconds : 0; }
};

struct ExampleReport {
  std::string torch_version;
  int intra_op_threads = 0;  ///< libtorch's, as it ran
  std::uint64_t train_images = 0, test_images = 0;
  std::size_t parameters = 0;
  double load_seconds = 0;  ///< decoding the IDX files and center-cropping the test set
  std::vector<EpochReport> epochs;
  /// From just before the loader (the pipeline, or the DataLoader and its workers) was made
  /// until the last batch had been used: what samples_per_s() is measured over.
  double seconds = 0;
  /// CPU time the process used over `seconds`, all its threads: a measure of the work done
  /// that a machine busy with other work disturbs less than the wall time.
  double cpu_seconds = 0;
  /// The first batch's tensors alias the loader's memory: stoker's batch storage (data_ptr
  /// compared once). Always false for libtorch's DataLoader, whose Stack copies every sample.
  bool zero_copy = false;
  std::string zero_copy_evidence;       ///< what was compared, for the human-readable output
  std::string input;                    ///< what the loader does, in one line
  std::optional<double> test_accuracy;  ///< when trained
  double checksum = 0;                  ///< --steps none: sum of each batch's first element

  std::uint64_t samples() const;
  std::uint64_t batches() const;
  double samples_per_s() const { return seconds > 0 ? static_cast<double>(samples()) / seconds : 0; }
};

struct ExampleCallbacks {
  std::function<void(const ExampleReport&)> on_start;      ///< data loaded, model made
  std::function<void(const ExampleReport&)> on_zero_copy;  ///< after the first batch
  std::function<void(const EpochReport&)> on_epoch;
};

/// Loads the data, trains (or only reads) and evaluates. Throws std::invalid_argument for
/// bad options, DataError for missing or bad data files, StageError when a pipeline stage
/// fails.
ExampleReport run_example(const ExampleOptions& options, const ExampleCallbacks& callbacks = {});

}  // namespace stoker::torch_example
