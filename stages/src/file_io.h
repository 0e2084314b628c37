// SPDX-License-Identifier: Apache-2.0
// Reading files for the readers; every failure is a DataError that names the file.
// Private to stoker_stages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stop_token>
#include <string>
#include <vector>

namespace stoker::detail {

/// A file read at given offsets, local or remote: what a tar archive's listing reads.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  virtual std::uint64_t size() const noexcept = 0;
  /// Its path or URL, as errors name it.
  virtual const std::string& name() const noexcept = 0;
  /// Fills `out` from `offset`; throws DataError naming the file when it ends first or a read fails.
  /// A read that waits for a server gives up once `stop` is requested (PipelineStopped).
  virtual void read_at(std::uint64_t offset, std::span<std::byte> out, const std::stop_token& stop) const = 0;
  void read_at(std::uint64_t offset, std::span<std::byte> out) const { read_at(offset, out, {}); }
};

/// A regular file open for reading at given offsets. Reads use pread, which does not move
/// a shared file position, so one InputFile may be read from several threads at once.
class InputFile final : public RandomAccessFile {
 public:
  /// Throws DataError when the file cannot be opened or is not a regular file.
  explicit InputFile(const std::filesystem::path& path);
  /// Takes `fd`, open for reading, as the file `name`: closes it, and throws DataError, when it is
  /// not a regular file.
  InputFile(int fd, std::string name);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  std::uint64_t size() const noexcept override { return size_; }
  const std::string& name() const noexcept override { return name_; }
  using RandomAccessFile::read_at;
  /// Reads from the local disk do not wait for a server: `stop` is not asked.
  void read_at(std::uint64_t offset, std::span<std::byte> out, const std::stop_token& stop) const override;

 private:
  void adopt();  // checks fd_ and reads its size

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
