// SPDX-License-Identifier: Apache-2.0
// Raw binary volumes: no header, the shape and dtype come from the caller.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "stoker/stages/reader.h"

namespace stoker {

namespace detail {
class InputFile;
}

/// Yields the volumes of a file that holds one or more arrays of `shape` and `dtype` back
/// to back (C order, the machine's byte order, no header), each read from disk when asked
/// for, so that the file need not fit in memory. Labels are `label` for every sample.
class RawVolumeReader final : public Reader {
 public:
  /// Throws DataError naming the file when it is missing or its size is not a whole number
  /// of volumes, and std::invalid_argument for an empty shape.
  RawVolumeReader(const std::filesystem::path& file, Shape shape, DType dtype, ReaderOptions options = {},
                  std::int32_t label = 0);

  std::uint64_t dataset_size() const override { return count_; }
  Sample read(std::uint64_t id) const override;
  std::uint64_t volume_bytes() const noexcept { return shape_.elements() * dtype_size(dtype_); }

 private:
  std::shared_ptr<const detail::InputFile> file_;  // shared by copies; reads are positional
  Shape shape_;
  DType dtype_;
  std::int32_t label_;
  std::uint64_t count_ = 0;
};

}  // namespace stoker
