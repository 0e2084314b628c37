// SPDX-License-Identifier: Apache-2.0
// Remote shards kept whole on the local disk, under a byte budget, shared by the threads and
// the processes of one host. Private to stoker_stages.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stop_token>
#include <string>

#include "file_io.h"

namespace stoker::detail {

class Remote;

/// What a cache did so far (RemoteCounts's cache_ fields).
struct CacheCounts {
  std::uint64_t hits = 0, fetches = 0, evictions = 0, skipped = 0;
};

/// A directory of whole shards, each named for its URL.
///
/// Invariant: the cache's files in the directory (shards, and shards being fetched, which take
/// their whole size when their fetch starts) never hold more than the budget in all. Other files
/// there are neither counted nor removed. Every step that
/// adds bytes to it takes the directory's lock (a file lock, `.stoker-cache.lock`), counts what
/// is there, and evicts least recently used shards first.
///
/// One fetch per shard on the host: a shard is fetched under its own file lock (`NAME.lock`),
/// which the threads and processes that want it too wait for; they then find it there. A fetch
/// writes `NAME.part` and renames it to `NAME` once every byte is written and flushed, so a
/// process that dies mid-fetch leaves no shard that looks whole (its `.part`, which no lock
/// holds, is removed by the next count). A shard is read through an open descriptor, so
/// evicting it from under a reader is safe.
class ShardCache {
 public:
  /// Creates `dir` when missing; throws std::invalid_argument naming RemoteOptions::cache_dir when
  /// it cannot be made or written, or RemoteOptions::cache_bytes when the budget is 0.
  ShardCache(std::filesystem::path dir, std::uint64_t budget);

  /// The local copy of `url`, which holds `size` bytes: there already (a hit; a copy of another
  /// size is a stale one, fetched again), or fetched whole through `remote`. None where it
  /// cannot be kept (it is larger than the budget, shards being fetched hold the budget, or the
  /// disk is full): its reads then go to the server, and are counted as skipped. A fetch that fails throws what
  /// `remote` threw; a stop throws PipelineStopped, within about 10 ms where it waits for another's fetch. `read`:
  /// false for a prefetch, whose finding the copy there counts as no hit.
  std::unique_ptr<InputFile> open(const std::string& url, std::uint64_t size, const Remote& remote,
                                  const std::stop_token& stop, bool read = true) const;

  CacheCounts counts() const noexcept { return {hits_.load(), fetches_.load(), evictions_.load(), skipped_.load()}; }
  const std::filesystem::path& dir() const noexcept { return dir_; }

 private:
  // The shard's file name in the directory: a hash of the whole URL, then its last part.
  std::string entry_name(const std::string& url) const;
  // Under the directory's lock: makes room for `size` bytes and creates `part` with them; its
  // descriptor, open for reading and writing, or -1 when the budget cannot make room.
  int reserve(const std::filesystem::path& part, std::uint64_t size, const std::string& url,
              const std::stop_token& stop) const;
  // The object's bytes into `fd` (`part`), flushed, then `part` renamed to `whole`.
  void fetch(const std::string& url, std::uint64_t size, const Remote& remote, int fd,
             const std::filesystem::path& part, const std::filesystem::path& whole, const std::stop_token& stop) const;

  std::filesystem::path dir_;
  std::uint64_t budget_;
  mutable std::atomic<std::uint64_t> hits_{0}, fetches_{0}, evictions_{0}, skipped_{0};
};

}  // namespace stoker::detail
