// SPDX-License-Identifier: Apache-2.0
// Data that lives behind HTTP(S) or in S3: which names are URLs, WebDataset's brace ranges, and
// how reads of remote objects behave when the network or the server fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace stoker {

/// Whether `where` names a remote object (it starts with http://, https:// or s3://) rather
/// than a local path.
bool is_url(std::string_view where) noexcept;

/// WebDataset's brace ranges and lists, as its shard names use them:
/// "train-{000..002}.tar" -> train-000.tar, train-001.tar, train-002.tar (numbers as wide as the
/// range's first bound), "{a,b}.tar" -> a.tar, b.tar; several braces multiply out, left to right.
/// A name without braces is itself. Throws std::invalid_argument naming the pattern for a brace
/// that is not closed, a range whose end is below its start, or more than a million names.
std::vector<std::string> expand_braces(std::string_view pattern);

/// How reads of remote objects (ImageDataset::from_tars() on URLs) behave when the network or the
/// server fails.
///
/// Each read is one HTTP request (a range of a shard: one member's bytes). A request that times
/// out, whose connection is refused or reset, whose body ends short of its length, or that is
/// answered 429 or 5xx is tried again, after a wait; one answered with another 4xx (403, 404) is
/// not, since asking again would get the same answer. A request that fails for good is a
/// DataError naming the URL, the last answer or failure and the attempts made.
struct RemoteOptions {
  /// One request's limit, from its start to its last byte; past it the request counts as failed.
  std::chrono::milliseconds timeout{30'000};
  /// Attempts after a request's first one.
  int retries = 5;
  /// The wait before the n-th retry is drawn uniformly from 0 to min(backoff x 2^(n-1),
  /// max_backoff) ("full jitter"): readers that failed together do not retry together.
  std::chrono::milliseconds backoff{100};
  std::chrono::milliseconds max_backoff{10'000};
  /// Retries of all of one data set's requests together. Once spent, a request fails on its first
  /// failure: a server that is down fails the run in seconds, not in hours of patient retries.
  std::uint64_t retry_budget = 1'000;
  /// The certificates (a PEM file) https:// servers are checked against; empty: the file
  /// CURL_CA_BUNDLE or SSL_CERT_FILE names (AWS_CA_BUNDLE for s3://), else the system's.
  std::string ca_file;
  /// A directory on the local disk that keeps whole shards (docs/remote.md, "The cache"): a
  /// shard's first read fetches all of it, and every later read of it, in this epoch and the
  /// next ones, by this process or another of the host, reads the local copy. Empty: no cache,
  /// every read is a request.
  std::filesystem::path cache_dir;
  /// The most bytes the cache directory holds: least recently used shards make room for new
  /// ones. A shard larger than this is read from the server. Must be set with cache_dir.
  std::uint64_t cache_bytes = 0;
  /// With a cache, for a source in ImageOrder::shards: how many of the epoch's next shards are
  /// fetched into the cache in the background while the current one is read, each by a thread of
  /// the data set's own (each fetch holds an 8 MiB buffer). 0: none; a shard is fetched when it
  /// is first read.
  std::uint32_t prefetch = 2;
  /// The most bytes that answers still to come may fill at once, all of the data set's range
  /// requests together (reads of shard members, and fetches, which ask 8 MiB at a time): a
  /// request whose bytes do not fit waits for others to end. One larger than this goes alone.
  /// Reads of whole objects, whose size is not known before (an index, a list, an image a list
  /// names), are not counted: each is bounded by its own limit.
  std::uint64_t max_bytes_in_flight = std::uint64_t{256} << 20;
};

/// What a data set's remote reads did so far (ImageDataset::remote_counts()).
struct RemoteCounts {
  std::uint64_t requests = 0;  ///< attempts made, retries included
  std::uint64_t retries = 0;   ///< of them, retries
  std::uint64_t bytes = 0;     ///< bytes of bodies kept: those of requests that succeeded
  std::uint64_t cache_hits = 0;       ///< reads of a shard's local copy (RemoteOptions::cache_dir)
  std::uint64_t cache_fetches = 0;    ///< shards this process fetched whole into the cache
  std::uint64_t cache_evictions = 0;  ///< shards this process removed from the cache to make room
  /// reads that went to the server because the cache could not keep their shard: larger than
  /// cache_bytes, the budget held by fetches in flight, or the disk full
  std::uint64_t cache_skipped = 0;
  std::uint64_t peak_bytes_in_flight = 0;  ///< the most bytes asked for and not yet arrived, at once
};

}  // namespace stoker
