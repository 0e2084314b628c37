// SPDX-License-Identifier: Apache-2.0
// Samples made up on the fly, for benchmarking the rest of a pipeline without I/O
// (tensorpack's FakeData).
#pragma once

#include <cstdint>

#include "stoker/stages/reader.h"

namespace stoker {

struct SyntheticOptions {
  Shape shape{1, 1, 28, 28, false};
  DType dtype = DType::u8;
  std::uint64_t count = 60'000;   ///< samples in the data set: one epoch with one shard
  std::uint64_t seed = 0;         ///< content and labels are a function of (seed, id) only
  std::int32_t num_classes = 10;  ///< labels are uniform in 0 .. num_classes-1
};

/// Yields samples of a fixed shape and dtype filled with pseudo-random values: uint8 and
/// uint16 uniform over their range, float32 uniform in [0, 1). The same (seed, id) gives
/// the same sample in every epoch, shard and run. Costs one fast generator step per 8 bytes.
class SyntheticSource final : public Reader {
 public:
  /// Throws std::invalid_argument naming the option for an empty shape or num_classes < 1.
  explicit SyntheticSource(SyntheticOptions synthetic = {}, ReaderOptions options = {});

  std::uint64_t dataset_size() const override { return synthetic_.count; }
  Sample read(std::uint64_t id) const override;
  const SyntheticOptions& synthetic_options() const noexcept { return synthetic_; }

 private:
  SyntheticOptions synthetic_;
};

}  // namespace stoker
