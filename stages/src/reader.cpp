// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "stoker/core/random.h"

#include "file_io.h"

namespace stoker {

Reader::Reader(ReaderOptions options) : options_(std::move(options)) {
  if (options_.num_shards == 0) throw std::invalid_argument("reader option num_shards must be at least 1, got 0");
  if (options_.shard_index >= options_.num_shards)
    throw std::invalid_argument("reader option shard_index " + std::to_string(options_.shard_index) +
                                " is out of range: with num_shards " + std::to_string(options_.num_shards) +
                                " it must be in 0.." + std::to_string(options_.num_shards - 1));
  if (!options_.pool) options_.pool = BufferPool::create();
}

std::uint64_t Reader::size() const {
  const std::uint64_t n = dataset_size(), first = options_.shard_index;
  return n > first ? (n - first - 1) / options_.num_shards + 1 : 0;
}

std::optional<Sample> Reader::operator()() {
  if (next_ >= size()) {
    next_ = 0;  // the next call starts the next epoch
    return std::nullopt;
  }
  return read(id_at(next_++));
}

std::string Reader::fingerprint() const {
  std::uint64_t hash = hash_name("");
  const auto add = [&](std::uint64_t id) {
    const Sample s = read(id);
    const auto* bytes = reinterpret_cast<const char*>(s.data.data());
    hash = derive_seed(hash, hash_name({bytes, s.data.size()}), static_cast<std::uint64_t>(s.label));
  };
  if (size() > 0) {
    add(id_at(0));
    add(id_at(size() - 1));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::to_string(dataset_size()) + " samples, shard " + std::to_string(options_.shard_index) + " of " +
         std::to_string(options_.num_shards) + ", samples hash " + hex;
}

void Reader::check_id(std::uint64_t id) const {
  if (id >= dataset_size())
    throw std::out_of_range("sample id " + std::to_string(id) + " is out of range: the data set has " +
                            std::to_string(dataset_size()) + " samples");
}

namespace detail {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

InputFile::InputFile(const std::filesystem::path& path) : name_(path.string()) {
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer before the check below
  // refuses it; reads from a regular file ignore the flag.
  fd_ = ::open(name_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw DataError(name_, "cannot open: " + errno_text());
  adopt();
}

InputFile::InputFile(int fd, std::string name) : name_(std::move(name)), fd_(fd) { adopt(); }

void InputFile::adopt() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const auto why = errno_text();
    ::close(fd_);
    throw DataError(name_, "cannot stat: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw DataError(name_, "is not a regular file");
  }
  if (const int flags = ::fcntl(fd_, F_GETFL); flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);  // reads block
  size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() { ::close(fd_); }

void InputFile::read_at(std::uint64_t offset, std::span<std::byte> out, const std::stop_token&) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ::ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<::off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DataError(name_, "read failed at byte " + std::to_string(offset + done) + ": " + errno_text());
    if (n == 0)
      throw DataError(name_, "file ended at byte " + std::to_string(offset + done) + " while reading " +
                                 std::to_string(out.size()) + " bytes at offset " + std::to_string(offset) +
                                 " (did it shrink while in use?)");
    done += static_cast<std::size_t>(n);
  }
}

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  InputFile file(path);
  std::vector<std::byte> bytes(file.size());
  file.read_at(0, bytes);
  return bytes;
}

}  // namespace detail
}  // namespace stoker
