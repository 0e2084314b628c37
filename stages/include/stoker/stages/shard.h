// SPDX-License-Identifier: Apache-2.0
// One rank's share of a data set, reshuffled every epoch: the source of a data-parallel job.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "stoker/core/stage.h"
#include "stoker/stages/reader.h"

namespace stoker {

/// A bijection of [0, n) drawn from `key`: a Feistel network on the fewest bits that hold n,
/// walked back into [0, n). O(1) memory and time per call, whatever n.
class Permutation {
 public:
  Permutation(std::uint64_t n, std::uint64_t key) noexcept;
  /// The image of i, for i < n.
  std::uint64_t operator()(std::uint64_t i) const noexcept;

 private:
  std::uint64_t n_, mask_;
  int half_;
  std::uint64_t keys_[4];
};

/// What to do with the samples left over when the data set does not divide by the ranks.
enum class Remainder : std::uint8_t {
  drop,  ///< each epoch, `size % world` samples (different ones every epoch) go nowhere
  pad,   ///< every sample goes somewhere; the last ranks also get a few of the epoch's first again
};

/// How an epoch's samples are dealt to the ranks: the k-th sample of the epoch's order goes to
/// rank `k % world`, so that every rank gets as many.
struct ShardOptions {
  std::uint32_t rank = 0;   ///< this process's rank, 0 to world - 1
  std::uint32_t world = 1;  ///< the number of ranks
  Remainder remainder = Remainder::drop;

  /// Throws std::invalid_argument, starting with `who`, when `world` is 0 or `rank >= world`.
  void check(const std::string& who) const;
  /// Samples each rank gets in an epoch of `size`.
  std::uint64_t per_rank(std::uint64_t size) const noexcept;
  /// Where this rank's k-th sample (k < per_rank(size)) lies in the epoch's order of `size`.
  std::uint64_t place(std::uint64_t size, std::uint64_t k) const noexcept;
};

/// A pipeline source of one rank's share of a data set. Every epoch the data set is put in a
/// new random order, drawn from the pipeline's seed and the epoch (the same on every rank, with
/// no communication), and the k-th sample of that order goes to rank `k % world`: in each epoch
/// every sample reaches exactly one rank (Remainder::drop leaves out `size % world` of them,
/// Remainder::pad sends those few to a second rank), and every rank gets the same number, so
/// that collective steps line up.
///
///   .source("read", stoker::ShuffledShard(std::make_shared<stoker::IdxReader>(data),
///                                         {.rank = comm.rank(), .world = comm.size()}))
///
/// It reads through Reader::read(id), which is thread-safe; copies share the reader. Resumable
/// (Pipeline::state): a sample follows from the seed, the epoch and the call's index alone.
class ShuffledShard {
 public:
  /// Throws std::invalid_argument naming the option when `world` is 0, `rank >= world`, or the
  /// reader is itself sharded (give it the whole data set).
  ShuffledShard(std::shared_ptr<const Reader> reader, ShardOptions options);

  /// Samples this rank gets per epoch (the same on every rank).
  std::uint64_t size() const noexcept { return per_rank_; }
  /// The id of this rank's k-th sample in epoch `epoch` of a pipeline seeded with `seed`.
  std::uint64_t id_at(std::uint64_t seed, std::uint32_t epoch, std::uint64_t k) const noexcept;

  std::optional<Sample> operator()(const StageContext& ctx) const;
  /// Nothing to do: the call's index says which sample it is.
  void seek(std::uint64_t) noexcept {}
  std::string fingerprint() const;

 private:
  std::shared_ptr<const Reader> reader_;
  ShardOptions options_;
  std::uint64_t size_ = 0, per_rank_ = 0;
};

}  // namespace stoker
