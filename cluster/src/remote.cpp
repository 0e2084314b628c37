// SPDX-License-Identifier: Apache-2.0
// What a remote edge is, whatever carries it: its options' rules and the workers' source.
#include <algorithm>
#include <iterator>
#include <mutex>
#include <stdexcept>

#include "communicator_impl.h"

namespace stoker::cluster {

namespace detail {

RemoteOptions checked(const Communicator& comm, RemoteOptions o) {
  const auto bad = [&](const std::string& what) {
    return std::invalid_argument("remote edge '" + o.name + "': " + what);
  };
  const int world = comm.size();
  if (world < 2)
    throw bad("it needs at least 2 ranks, a trainer and a worker; this world has " + std::to_string(world) +
              " (start the program with mpirun -np N)");
  if (o.trainer < 0 || o.trainer >= world)
    throw bad("trainer " + std::to_string(o.trainer) + " is not a rank of a world of " + std::to_string(world));
  if (o.workers.empty()) {
    for (int r = 0; r < world; ++r)
      if (r != o.trainer) o.workers.push_back(r);
  }
  auto sorted = o.workers;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const int r = sorted[i];
    if (r < 0 || r >= world)
      throw bad("worker " + std::to_string(r) + " is not a rank of a world of " + std::to_string(world));
    if (r == o.trainer) throw bad("rank " + std::to_string(r) + " is both the trainer and a worker");
    if (i > 0 && sorted[i - 1] == r) throw bad("worker " + std::to_string(r) + " is listed twice");
  }
  if (o.capacity < o.workers.size())
    throw bad("capacity " + std::to_string(o.capacity) + " is less than its " + std::to_string(o.workers.size()) +
              " workers: each needs at least one credit");
  if (o.shard == 0) throw bad("shard must be at least 1 sample");
  return o;
}

}  // namespace detail

RemoteShards::RemoteShards(std::shared_ptr<detail::Link> link, std::shared_ptr<const Reader> reader)
    : link_(std::move(link)), reader_(reader), order_(std::move(reader), {.rank = 0, .world = 1}) {}

std::optional<Sample> RemoteShards::operator()(const StageContext& ctx) {
  if (!link_) return std::nullopt;
  std::optional<std::uint64_t> position;
  {
    const stoker::detail::TurnReleased waiting(ctx);  // the trainer's word: no turn of a ThreadBudget held meanwhile
    position = link_->position(ctx.epoch, ctx.index, order_.size(), ctx.stop);
  }
  if (!position) return std::nullopt;
  return reader_->read(order_.id_at(ctx.seed, ctx.epoch, *position));
}

std::string RemoteShards::fingerprint() const { return order_.fingerprint() + ", shards from a remote edge"; }

namespace detail {

PipelineState start_state(PipelineState blank, const Work& work) {
  const std::uint64_t fanout = units_per_sample(blank);
  if (!work.partial.empty() && fanout != work.fanout)
    throw StateError("the work handed out is of samples of " + std::to_string(work.fanout) +
                     " units, and this worker's pipeline makes " + std::to_string(fanout) + " of each");
  // The partly made samples come first, in order of position; of each, its units listed.
  std::vector<std::uint64_t> make;
  std::uint64_t calls = 0, last = UINT64_MAX;
  for (const std::uint64_t u : work.partial) {
    if (u / fanout != last) {
      last = u / fanout;
      ++calls;
    }
    make.push_back((calls - 1) * fanout + u % fanout);
  }
  blank.epoch = work.epoch;
  blank.consumed = 0;
  blank.taken->below = calls * fanout;
  blank.taken->except = std::move(make);
  return blank;
}

std::vector<std::uint64_t> newly_taken(const PipelineState::Taken& before, const PipelineState::Taken& after) {
  // Taken before: below `before.below`, but `before.except`. Taken after: the same of `after`.
  std::vector<std::uint64_t> out;
  auto still = after.except.begin();
  const auto untaken_after = [&](std::uint64_t o) {
    if (o >= after.below) return true;
    while (still != after.except.end() && *still < o) ++still;
    return still != after.except.end() && *still == o;
  };
  for (const std::uint64_t o : before.except)  // ascending, all below before.below
    if (!untaken_after(o)) out.push_back(o);
  for (std::uint64_t o = before.below; o < after.below; ++o)
    if (!untaken_after(o)) out.push_back(o);
  return out;
}

}  // namespace detail

}  // namespace stoker::cluster

namespace stoker::cluster {

namespace {

// Freed blocks, for Bytes to take again.
class BlockCache {
 public:
  static constexpr std::size_t kMaxBlocks = 64, kMaxBytes = std::size_t{256} << 20;

  // A cached block of at least n bytes and at most 2n, or nullptr.
  std::byte* take(std::size_t n, std::size_t& capacity) {
    std::lock_guard lock(mutex_);
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {  // the newest: the likeliest in cache
      if (it->capacity < n || it->capacity / 2 > n) continue;
      std::byte* data = it->data;
      capacity = it->capacity;
      bytes_ -= capacity;
      blocks_.erase(std::next(it).base());
      return data;
    }
    return nullptr;
  }
  // Keeps the block, freeing the oldest ones that no longer fit: sizes change (an edge of
  // small items, then one of batches), and the cache follows.
  void give(std::byte* data, std::size_t capacity) {
    if (capacity > kMaxBytes) {
      delete[] data;
      return;
    }
    std::vector<Block> evicted;
    {
      std::lock_guard lock(mutex_);
      while (!blocks_.empty() && (blocks_.size() == kMaxBlocks || bytes_ + capacity > kMaxBytes)) {
        bytes_ -= blocks_.front().capacity;
        evicted.push_back(blocks_.front());
        blocks_.erase(blocks_.begin());
      }
      blocks_.push_back({data, capacity});
      bytes_ += capacity;
    }
    for (const auto& b : evicted) delete[] b.data;
  }
  ~BlockCache() {
    for (const auto& b : blocks_) delete[] b.data;
  }

 private:
  struct Block {
    std::byte* data;
    std::size_t capacity;
  };
  std::mutex mutex_;
  std::vector<Block> blocks_;
  std::size_t bytes_ = 0;
};

BlockCache& block_cache() {
  static BlockCache cache;
  return cache;
}

}  // namespace

Bytes::Bytes(std::size_t n) : size_(n) {
  if (n == 0) return;
  data_ = block_cache().take(n, capacity_);
  if (!data_) {
    data_ = new std::byte[n];  // default-initialized: not filled
    capacity_ = n;
  }
}

Bytes::~Bytes() {
  if (data_) block_cache().give(data_, capacity_);
}

}  // namespace stoker::cluster
