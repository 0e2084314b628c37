// SPDX-License-Identifier: Apache-2.0
// What every reader shares: the error for bad input data, the sharding options, and the
// protocol that makes a reader a pipeline source.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/sample.h"

namespace stoker {

/// Bad input data: a file that is missing, truncated or malformed. The message starts with
/// the file's name, then says what is wrong: "data/a.npy: Fortran order is not supported ...".
class DataError : public std::runtime_error {
 public:
  DataError(std::string file, const std::string& problem)
      : std::runtime_error(file + ": " + problem), file_(std::move(file)) {}
  const std::string& file() const noexcept { return file_; }

 private:
  std::string file_;
};

/// Options every reader takes.
struct ReaderOptions {
  /// Sample i of the data set belongs to shard `i % num_shards`: shards are disjoint, cover
  /// the data set exactly once together, and each keeps the data set's order. Give each
  /// worker (process, GPU) its own `shard_index` and the same `num_shards`.
  std::uint32_t shard_index = 0;
  std::uint32_t num_shards = 1;
  /// Where the storage of the samples a reader makes comes from; null gives the reader a pool
  /// of its own. (IdxReader makes none: its samples are views of its data set.)
  std::shared_ptr<BufferPool> pool = nullptr;
};

/// A data set of samples with ids 0 .. dataset_size()-1, of which a reader yields one shard.
///
/// A reader is a pipeline source: each call yields the next sample of its shard, in id
/// order; after the last one it returns nullopt (the end of the epoch) and the call after
/// that starts the next epoch from the beginning:
///
///   stoker::IdxReader reader(stoker::fashion_mnist(), {.shard_index = rank, .num_shards = ranks});
///   auto pipe = stoker::PipelineBuilder{}.source("read", reader) ... .build();
///
/// A sample's id is its index in the whole data set, the same in every epoch and every
/// shard, so that per-sample random draws (seeded by the id) do not depend on sharding.
/// Copies of a reader share its data and pool; each copy has its own position.
class Reader {
 public:
  virtual ~Reader() = default;

  /// Samples in the whole data set, all shards together.
  virtual std::uint64_t dataset_size() const = 0;

  /// Sample `id` of the whole data set (of any shard). Thread-safe. Throws std::out_of_range
  /// when `id >= dataset_size()` and DataError when the data turns out to be bad.
  virtual Sample read(std::uint64_t id) const = 0;

  /// Samples in this reader's shard: one epoch.
  std::uint64_t size() const;

  /// The id of the k-th sample of this shard.
  std::uint64_t id_at(std::uint64_t k) const noexcept { return options_.shard_index + k * options_.num_shards; }

  /// The next sample of this shard, or nullopt at the end of the epoch; the call after
  /// nullopt starts the next epoch. Not thread-safe: a pipeline's source runs serially.
  std::optional<Sample> operator()();

  /// Starts the epoch over from the shard's first sample.
  void rewind() noexcept { next_ = 0; }
  /// Makes the next call yield the shard's k-th sample (exact resume, Pipeline::state).
  void seek(std::uint64_t k) noexcept { next_ = k; }
  /// Tells data sets apart, for a resumed pipeline to refuse a state taken on other data: the
  /// shape of the shard and a hash of the bytes and labels of its first and last samples.
  std::string fingerprint() const;

  const ReaderOptions& options() const noexcept { return options_; }
  const std::shared_ptr<BufferPool>& pool() const noexcept { return options_.pool; }

 protected:
  /// Throws std::invalid_argument naming the option when the shard options are out of range.
  explicit Reader(ReaderOptions options);
  // Protected so that a reader cannot be sliced into a bare Reader by accident.
  Reader(const Reader&) = default;
  Reader(Reader&&) = default;
  Reader& operator=(const Reader&) = default;
  Reader& operator=(Reader&&) = default;

  /// Throws std::out_of_range when `id` is not in the data set.
  void check_id(std::uint64_t id) const;

 private:
  ReaderOptions options_;
  std::uint64_t next_ = 0;  // position in the shard
};

/// A pipeline source of the ids of a reader's shard instead of its samples, in the same
/// order, then the end of each epoch: for a stage that has the samples already, such as
/// GpuAugment::resident, which holds the whole data set on the device.
///   .source("ids", stoker::IdSource(reader))
class IdSource {
 public:
  explicit IdSource(const Reader& reader)
      : size_(reader.size()),
        first_(reader.options().shard_index),
        step_(reader.options().num_shards),
        fingerprint_(reader.fingerprint()) {}
  std::optional<std::uint64_t> operator()() {
    if (next_ >= size_) {  // a resume may seek to the end, or past it (after a short last batch)
      next_ = 0;
      return std::nullopt;
    }
    return first_ + next_++ * step_;
  }
  void seek(std::uint64_t k) noexcept { next_ = k; }
  std::string fingerprint() const { return fingerprint_; }

 private:
  std::uint64_t size_, first_, step_, next_ = 0;
  std::string fingerprint_;
};

}  // namespace stoker
