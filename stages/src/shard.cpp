// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/shard.h"

#include <bit>
#include <stdexcept>

#include "stoker/core/random.h"

namespace stoker {

Permutation::Permutation(std::uint64_t n, std::uint64_t key) noexcept : n_(n) {
  // Half of the bits of the smallest power of four >= n: the network's domain is under 4n, so
  // a walk back into [0, n) takes fewer than four steps on average.
  const int bits = n > 1 ? std::bit_width(n - 1) : 1;
  half_ = (bits + 1) / 2;
  mask_ = (std::uint64_t{1} << half_) - 1;
  for (auto& k : keys_) k = key = mix64(key);
}

std::uint64_t Permutation::operator()(std::uint64_t i) const noexcept {
  // A permutation of the domain, applied until it lands in [0, n): the walk from a point of
  // [0, n) comes back to [0, n) before it could reach another one's, so this is a bijection.
  do {
    std::uint64_t left = i >> half_, right = i & mask_;
    for (const std::uint64_t k : keys_) {
      const std::uint64_t next = left ^ (mix64(right ^ k) & mask_);
      left = right;
      right = next;
    }
    i = (left << half_) | right;
  } while (i >= n_);
  return i;
}

void ShardOptions::check(const std::string& who) const {
  if (world == 0) throw std::invalid_argument(who + ": world must be at least 1");
  if (rank >= world)
    throw std::invalid_argument(who + ": rank " + std::to_string(rank) + " is out of range for world " +
                                std::to_string(world));
}

std::uint64_t ShardOptions::per_rank(std::uint64_t size) const noexcept {
  return remainder == Remainder::drop ? size / world : (size + world - 1) / world;
}

std::uint64_t ShardOptions::place(std::uint64_t size, std::uint64_t k) const noexcept {
  const std::uint64_t j = k * world + rank;
  return j % size;  // past the end (pad): the epoch's first again, round and round when world > size
}

ShuffledShard::ShuffledShard(std::shared_ptr<const Reader> reader, ShardOptions options)
    : reader_(std::move(reader)), options_(options) {
  if (!reader_) throw std::invalid_argument("ShuffledShard: no reader");
  options_.check("ShuffledShard");
  if (reader_->options().num_shards != 1)
    throw std::invalid_argument("ShuffledShard: the reader is itself sharded (num_shards " +
                                std::to_string(reader_->options().num_shards) +
                                "): give it the whole data set, ShuffledShard shares it out");
  size_ = reader_->dataset_size();
  per_rank_ = options_.per_rank(size_);
}

std::uint64_t ShuffledShard::id_at(std::uint64_t seed, std::uint32_t epoch, std::uint64_t k) const noexcept {
  const Permutation order(size_, derive_seed(seed, epoch, hash_name("ShuffledShard")));
  return order(options_.place(size_, k));
}

std::optional<Sample> ShuffledShard::operator()(const StageContext& ctx) const {
  if (ctx.index >= per_rank_) return std::nullopt;
  return reader_->read(id_at(ctx.seed, ctx.epoch, ctx.index));
}

std::string ShuffledShard::fingerprint() const {
  return reader_->fingerprint() + ", rank " + std::to_string(options_.rank) + " of " + std::to_string(options_.world) +
         (options_.remainder == Remainder::drop ? ", remainder dropped" : ", padded");
}

}  // namespace stoker
