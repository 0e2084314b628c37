// SPDX-License-Identifier: Apache-2.0
#include "shard_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "remote_io.h"
#include "stoker/core/random.h"
#include "stoker/core/stage.h"
#include "stoker/stages/reader.h"

namespace stoker::detail {

namespace fs = std::filesystem;

namespace {

// A file descriptor, closed (and its file lock released) at the end of its scope.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& other) noexcept : fd(std::exchange(other.fd, -1)) {}
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() noexcept { return std::exchange(fd, -1); }
};

std::string errno_text(int e = errno) { return std::strerror(e); }

constexpr const char* kDirLock = ".stoker-cache.lock";

// Waits for an exclusive lock on the file `path` (made when missing). flock() locks belong to
// an open file, so two threads of one process exclude each other as two processes do. Asked
// again every 10 ms, so that a stop is heard.
Fd lock_file(const fs::path& path, const std::stop_token& stop) {
  Fd f(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (f.fd < 0) throw DataError(path.string(), "cannot open the cache's lock file: " + errno_text());
  while (::flock(f.fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) throw DataError(path.string(), "cannot lock: " + errno_text());
    if (stop.stop_requested()) throw PipelineStopped();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f;
}

bool reserved_suffix(std::string_view name) { return name.ends_with(".part") || name.ends_with(".lock"); }

// Whether `name` is one of the cache's own files (entry_name(): 16 hex digits and a dash first):
// other files in the directory are neither counted nor ever removed.
bool own_file(std::string_view name) {
  return name.size() > 17 && name[16] == '-' && std::all_of(name.begin(), name.begin() + 16, [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c));
         });
}

}  // namespace

ShardCache::ShardCache(fs::path dir, std::uint64_t budget) : dir_(std::move(dir)), budget_(budget) {
  if (budget_ == 0)
    throw std::invalid_argument("RemoteOptions::cache_bytes must be above 0 where RemoteOptions::cache_dir is set ('" +
                                dir_.string() + "')");
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error || !fs::is_directory(dir_))
    throw std::invalid_argument("RemoteOptions::cache_dir '" + dir_.string() +
                                "' is not a directory that can be made: " + error.message());
  if (::access(dir_.c_str(), W_OK | X_OK) != 0)
    throw std::invalid_argument("RemoteOptions::cache_dir '" + dir_.string() + "' cannot be written: " + errno_text());
}

std::string ShardCache::entry_name(const std::string& url) const {
  std::string last = url.substr(url.find_last_of('/') + 1);
  last = last.substr(0, last.find('?'));
  if (last.size() > 80) last.erase(0, last.size() - 80);
  for (char& c : last)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  if (last.empty() || reserved_suffix(last)) last += '_';  // not empty (own_file()), not a fetch's or a lock's
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(hash_name(url)));
  return std::string(hash) + "-" + last;
}

std::unique_ptr<InputFile> ShardCache::open(const std::string& url, std::uint64_t size, const Remote& remote,
                                            const std::stop_token& stop, bool read) const {
  const fs::path whole = dir_ / entry_name(url);
  const auto hit = [&]() -> std::unique_ptr<InputFile> {
    Fd f(::open(whole.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.fd < 0) {
      if (errno == ENOENT) return nullptr;
      throw DataError(whole.string(), "cannot open this cached copy of " + url + ": " + errno_text());
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size) return nullptr;
    // Its last use, which eviction goes by; once a second is often enough.
    if (std::chrono::system_clock::now() - std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec) >
        std::chrono::seconds(1))
      ::futimens(f.fd, nullptr);
    if (read) hits_.fetch_add(1, std::memory_order_relaxed);
    return std::make_unique<InputFile>(f.release(), whole.string());
  };
  const auto not_kept = [&]() -> std::unique_ptr<InputFile> {  // read from the server instead
    if (read) skipped_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  };
  if (auto file = hit()) return file;
  if (size == 0 || size > budget_) return not_kept();
  const Fd shard_lock = lock_file(fs::path(whole) += ".lock", stop);
  if (auto file = hit()) return file;  // fetched while this one waited
  std::error_code ignored;
  fs::remove(whole, ignored);  // a copy of another size: the object changed since it was kept
  const fs::path part = fs::path(whole) += ".part";
  fs::remove(part, ignored);  // a dead fetch's: this one holds the shard's lock
  Fd out(reserve(part, size, url, stop));
  if (out.fd < 0) return not_kept();
  try {
    fetch(url, size, remote, out.fd, part, whole, stop);
  } catch (...) {
    fs::remove(part, ignored);
    throw;
  }
  fetches_.fetch_add(1, std::memory_order_relaxed);
  return std::make_unique<InputFile>(out.release(), whole.string());
}

int ShardCache::reserve(const fs::path& part, std::uint64_t size, const std::string& url,
                        const std::stop_token& stop) const {
  const Fd dir_lock = lock_file(dir_ / kDirLock, stop);
  struct Shard {
    fs::path path;
    std::uint64_t bytes;
    std::int64_t used_ns;
  };
  std::vector<Shard> shards;
  std::uint64_t total = 0;
  std::error_code error, ignored;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    const fs::path& path = it->path();
    const std::string name = path.filename().string();
    struct stat st {};
    if (!own_file(name) || name.ends_with(".lock") || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (name.ends_with(".part")) {
      // A fetch's, while its shard's lock is held; else left by a process that died mid-fetch.
      const Fd lock(::open((dir_ / (name.substr(0, name.size() - 5) + ".lock")).c_str(), O_RDWR | O_CLOEXEC));
      if (lock.fd < 0 || ::flock(lock.fd, LOCK_EX | LOCK_NB) == 0) {
        fs::remove(path, ignored);
        continue;
      }
    } else {
      shards.push_back({path, static_cast<std::uint64_t>(st.st_size),
                        std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec});
    }
    total += static_cast<std::uint64_t>(st.st_size);
  }
  if (error) throw DataError(dir_.string(), "cannot list the cache: " + error.message());
  std::uint64_t fetching = total;  // the bytes of fetches in flight, which no eviction frees
  for (const Shard& s : shards) fetching -= s.bytes;
  if (fetching > budget_ || size > budget_ - fetching) return -1;  // evicting could not make room
  std::sort(shards.begin(), shards.end(), [](const Shard& a, const Shard& b) { return a.used_ns < b.used_ns; });
  for (const Shard& s : shards) {  // least recently used first
    if (total <= budget_ && size <= budget_ - total) break;
    if (fs::remove(s.path, ignored)) evictions_.fetch_add(1, std::memory_order_relaxed);
    total -= s.bytes;  // removed now, or by another meanwhile
  }
  Fd out(::open(part.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (out.fd < 0) throw DataError(part.string(), "cannot create this cache file: " + errno_text());
  // The whole size now, so that the next count sees it, and a full disk is met here, not mid-fetch.
  if (const int e = ::posix_fallocate(out.fd, 0, static_cast<::off_t>(size)); e != 0) {
    fs::remove(part, ignored);
    if (e == ENOSPC || e == EDQUOT) return -1;  // the disk is full (removed copies still open hold space)
    throw DataError(dir_.string(),
                    "cannot keep the " + std::to_string(size) + " bytes of " + url + " in the cache: " + errno_text(e));
  }
  return out.release();
}

void ShardCache::fetch(const std::string& url, std::uint64_t size, const Remote& remote, int fd, const fs::path& part,
                       const fs::path& whole, const std::stop_token& stop) const {
  constexpr std::uint64_t kChunk = std::uint64_t{8} << 20;  // a request's bytes, and this fetch's memory
  std::vector<std::byte> buffer(std::min(size, kChunk));
  for (std::uint64_t at = 0; at < size;) {
    const std::size_t n = std::min(size - at, kChunk);
    remote.read(url, at, {buffer.data(), n}, stop);
    for (std::size_t done = 0; done < n;) {
      const ::ssize_t w = ::pwrite(fd, buffer.data() + done, n - done, static_cast<::off_t>(at + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw DataError(part.string(), "cannot write this cache file: " + errno_text());
      done += static_cast<std::size_t>(w);
    }
    at += n;
  }
  // Flushed before it takes its name: a copy that looks whole is whole, even after a crash.
  if (::fdatasync(fd) != 0) throw DataError(part.string(), "cannot flush this cache file: " + errno_text());
  if (::rename(part.c_str(), whole.c_str()) != 0)
    throw DataError(part.string(), "cannot rename this cache file to " + whole.string() + ": " + errno_text());
}

}  // namespace stoker::detail
