// SPDX-License-Identifier: Apache-2.0
// Reading remote objects over HTTP(S) and S3 with libcurl, for the data sets. Private to
// stoker_stages: no libcurl type leaves remote.cpp.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "file_io.h"
#include "shard_cache.h"
#include "stoker/stages/remote.h"

namespace stoker::detail {

struct S3Settings;

/// The reads of one data set's remote objects: its options, its retry budget and its counts.
/// Thread-safe: each thread makes its requests on a libcurl handle of its own, which keeps its
/// connections open from one request to the next.
class Remote {
 public:
  explicit Remote(RemoteOptions options);
  ~Remote();
  Remote(const Remote&) = delete;
  Remote& operator=(const Remote&) = delete;

  /// The object's size in bytes (a HEAD request).
  std::uint64_t size(const std::string& url) const;
  /// Fills `out` with the object's bytes from `offset` (one range request); every byte or a
  /// DataError, never part of them. Gives up, throwing PipelineStopped, within about a second
  /// of `stop` being requested, in a request or between attempts.
  void read(const std::string& url, std::uint64_t offset, std::span<std::byte> out, std::stop_token stop = {}) const;
  /// The whole object, up to `limit` bytes (a longer one is a DataError); none when the server
  /// says it is not there (404) and `missing_ok`.
  std::optional<std::vector<std::byte>> read_all(const std::string& url, std::uint64_t limit, bool missing_ok,
                                                 std::stop_token stop = {}) const;

  /// `url`'s copy in the cache (RemoteOptions::cache_dir), fetched there whole when missing;
  /// none without a cache, or where the cache cannot keep it (ShardCache::open).
  std::unique_ptr<InputFile> cached(const std::string& url, std::uint64_t size, const std::stop_token& stop) const {
    return cache_ ? cache_->open(url, size, *this, stop) : nullptr;
  }
  /// Whether prefetch() does anything: a cache, and RemoteOptions::prefetch above 0.
  bool prefetches() const noexcept { return cache_ && options_.prefetch > 0; }
  /// Asks for `url` (`size` bytes) to be fetched into the cache in the background, by one of
  /// RemoteOptions::prefetch threads of this object's own (started at the first call); a URL
  /// already asked for and not yet done is not asked again. A fetch that fails is left to the
  /// reads, which meet the failure themselves and report it. Nothing without prefetches().
  void prefetch(const std::string& url, std::uint64_t size) const;

  RemoteCounts counts() const noexcept;
  const RemoteOptions& options() const noexcept { return options_; }

 private:
  struct Outcome;
  void with_retries(const std::string& url, const std::function<Outcome()>& once, std::stop_token stop = {}) const;
  // The S3 settings for an s3:// URL (read on first use), none for another.
  const S3Settings* s3_of(const std::string& url) const;

  // Waits (giving up on a stop) until `bytes` more fit under RemoteOptions::max_bytes_in_flight,
  // or none are in flight, and counts them in; release() counts them out.
  void admit(std::uint64_t bytes, const std::stop_token& stop) const;
  void release(std::uint64_t bytes) const;
  void prefetcher(std::stop_token stop) const;  // a prefetch thread's loop

  RemoteOptions options_;
  std::unique_ptr<const ShardCache> cache_;  // where options_.cache_dir is set
  mutable std::unique_ptr<S3Settings> s3_;  // read from the environment and ~/.aws on first use
  mutable std::once_flag s3_once_;
  mutable std::atomic<std::uint64_t> requests_{0}, retries_{0}, bytes_{0}, budget_left_;

  mutable std::mutex flight_mutex_;
  mutable std::condition_variable_any flight_changed_;
  mutable std::uint64_t in_flight_ = 0, peak_in_flight_ = 0;

  mutable std::mutex prefetch_mutex_;
  mutable std::condition_variable_any prefetch_asked_;
  mutable std::deque<std::pair<std::string, std::uint64_t>> prefetch_queue_;
  mutable std::set<std::string> prefetch_pending_;  // queued or being fetched
  mutable std::vector<std::jthread> prefetchers_;   // last: stopped and joined first
};

/// A remote object read at given offsets, as InputFile reads a local one.
class RemoteFile final : public RandomAccessFile {
 public:
  /// Asks for its size (one request).
  RemoteFile(std::shared_ptr<const Remote> remote, std::string url);
  /// One whose size is known (from its listing): no request.
  RemoteFile(std::shared_ptr<const Remote> remote, std::string url, std::uint64_t size)
      : remote_(std::move(remote)), url_(std::move(url)), size_(size) {}
  std::uint64_t size() const noexcept override { return size_; }
  const std::string& name() const noexcept override { return url_; }
  using RandomAccessFile::read_at;
  void read_at(std::uint64_t offset, std::span<std::byte> out, const std::stop_token& stop) const override {
    remote_->read(url_, offset, out, stop);
  }

 private:
  std::shared_ptr<const Remote> remote_;
  std::string url_;
  std::uint64_t size_ = 0;
};

}  // namespace stoker::detail
