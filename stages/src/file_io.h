// SPDX-License-Identifier: Apache-2.0
// Reading files for the readers; every failure is a DataError that names the file.
// Private to stoker_stages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace stoker::detail {

/// A regular file open for reading at given offsets. Reads use pread, which does not move
/// a shared file position, so one InputFile may be read from several threads at once.
class InputFile {
 public:
  /// Throws DataError when the file cannot be opened or is not a regular file.
  explicit InputFile(const std::filesystem::path& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  std::uint64_t size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }

  /// Fills `out` from `offset`; throws DataError when the file ends first or a read fails.
  void read_at(std::uint64_t offset, std::span<std::byte> out) const;

 private:
  std::string name_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// The whole file. Throws DataError naming it.
std::vector<std::byte> read_file(const std::filesystem::path& path);

/// `a * b`, or false when it overflows 64 bits.
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return !__builtin_mul_overflow(a, b, &out);
}

}  // namespace stoker::detail
