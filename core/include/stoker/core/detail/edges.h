// The queues between stages, as stages see them, and a stage's output. Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "stoker/core/detail/spin_lock.h"
#include "stoker/core/queue_meter.h"
#include "stoker/core/random.h"
#include "stoker/core/random_shuffle_queue.h"
#include "stoker/core/state.h"

namespace stoker::detail {

enum class Pop {
  items,   ///< appended at least one item
  empty,   ///< nothing may be taken now; more will come
  ended,   ///< the epoch's last item has been taken
  closed,  ///< the pipeline is stopping
};

/// A named, bounded queue between two stages: FIFO, or a random-shuffle buffer. Items move in
/// chunks, under one lock per chunk; the order is total (FIFO across producers), so
/// deterministic mode needs no reordering here.
///
/// Capacity is counted in items, and a push is all or nothing: a chunk goes in only when the
/// queue has room for all of it, so the queue never holds more than its capacity. A shuffle
/// holds at least `min_after_dequeue` items while open, so the room it can ever have is
/// `capacity - min_after_dequeue`; max_chunk() is half of that (at least 1), which every chunk
/// pushed must respect, so that a waiting producer always gets its room eventually and a
/// producer and its consumer work at the same time.
///
/// The fields that stages read without the lock (held_, ended_, closed_) are written under it
/// with sequentially consistent stores; the wake-up protocol (runtime.h) relies on that.
class EdgeBase : public QueueMeter {
 public:
  EdgeBase(std::string name, std::size_t capacity, std::size_t floor, std::string producer, std::string consumer)
      : QueueMeter(std::move(name), capacity),
        floor_(floor),
        producer_(std::move(producer)),
        consumer_(std::move(consumer)) {}
  virtual ~EdgeBase() = default;

  const std::string& producer() const { return producer_; }
  const std::string& consumer() const { return consumer_; }

  /// Called by build(): whether the pipeline is deterministic, and the seed a shuffle without
  /// one of its own derives its streams from.
  virtual void start(bool deterministic, std::uint64_t seed) = 0;
  /// Prepares epoch `epoch`; called while no stage body runs.
  virtual void begin_epoch(std::uint32_t epoch) = 0;

  std::size_t room() const noexcept { return capacity() - held_.load(); }
  std::size_t max_chunk() const noexcept { return std::max<std::size_t>(1, (capacity() - floor_) / 2); }
  /// True when a pop would not report `empty`.
  bool ready() const noexcept { return closed_.load() || ended_.load() || held_.load() > floor_; }
  /// True once the epoch has ended and its last item has been taken.
  bool drained() const noexcept { return ended_.load() && held_.load() == 0; }

  /// Items taken this epoch so far.
  std::uint64_t taken() {
    std::lock_guard lock(mutex_);
    return popped_;
  }

  /// A shuffle's window and seed, what decides its order in deterministic mode; empty for a FIFO.
  virtual std::string describe() const = 0;
  /// For a shuffle whose producer has ended the epoch: the items it got in the epoch.
  std::optional<std::uint64_t> input_total() {
    std::lock_guard lock(mutex_);
    return ended_.load() ? std::optional(pushed_) : std::nullopt;
  }
  /// Exact resume: the first `n` items the producer pushes from now on are dropped (the outputs
  /// of a flat_map's first input that the consumer had taken).
  void skip_pushes(std::uint64_t n) {
    std::lock_guard lock(mutex_);
    skip_ = n;
  }

  /// For good (the pipeline stops): pops report `closed`, pushes fail, the consumer wakes.
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_.store(true);
    }
    wake_consumer();
  }

  /// A producer that holds `n` items it could not push counts them here while it waits, so
  /// that the occupancy shows the queue full rather than with room (QueueMeter).
  void note_waiting(std::ptrdiff_t n) noexcept {
    if (n > 0) count_in(static_cast<std::size_t>(n));
    if (n < 0) count_out(static_cast<std::size_t>(-n));
  }

 protected:
  // Under mutex_: items that may be taken now.
  std::size_t poppable_locked() const noexcept {
    const std::size_t held = held_.load();
    return ended_.load() ? held : held > floor_ ? held - floor_ : 0;
  }
  // Under mutex_, after making items poppable: whether the consumer's thread waits for them.
  bool wake_consumer_locked() const noexcept { return consumer_waiting_ && ready(); }
  // The consumer's thread sleeps on `signal_` (a futex): lighter than a condition variable,
  // whose notify contends with the waiter for the variable's own lock.
  void wake_consumer() noexcept {
    signal_.fetch_add(1);
    signal_.notify_one();
  }

  const std::size_t floor_;  // what a pop leaves behind while the epoch is open
  SpinLock mutex_;
  std::atomic<std::uint32_t> signal_{0};
  bool consumer_waiting_ = false;  // under mutex_
  std::uint64_t popped_ = 0;       // under mutex_: items taken this epoch
  std::uint64_t pushed_ = 0;       // under mutex_: items put this epoch (their positions)
  std::uint64_t skip_ = 0;         // under mutex_: pushed items to drop (skip_pushes)
  std::atomic<std::size_t> held_{0};
  std::atomic<bool> ended_{false}, closed_{false};

 private:
  std::string producer_, consumer_;
};

template <class T>
class Edge final : public EdgeBase {
 public:
  /// A FIFO queue of `capacity` items.
  Edge(std::string name, std::size_t capacity, std::string producer, std::string consumer)
      : EdgeBase(std::move(name), capacity, 0, std::move(producer), std::move(consumer)) {}
  /// A random-shuffle buffer (RandomShuffleQueue's semantics).
  Edge(std::string name, ShuffleOptions shuffle, std::string producer, std::string consumer)
      : EdgeBase(std::move(name), shuffle.capacity, shuffle.min_after_dequeue, std::move(producer),
                 std::move(consumer)),
        shuffle_options_(shuffle) {}

  // Deterministic mode draws from the oldest items (ShuffleRule::oldest_window), which does not
  // depend on how far the producer ran ahead; free order from all held, as TensorFlow does.
  void start(bool deterministic, std::uint64_t seed) override {
    if (!shuffle_options_) return;
    const auto& o = *shuffle_options_;
    seed_ = o.seed.value_or(derive_seed(seed, hash_name(name())));
    window_ = deterministic ? o.min_after_dequeue + 1 : o.capacity;
    shuffle_.emplace(window_, seed_);
  }
  void begin_epoch(std::uint32_t epoch) override {
    std::lock_guard lock(mutex_);
    ended_.store(false);
    popped_ = pushed_ = skip_ = 0;
    epoch_seed_ = derive_seed(seed_, epoch);
    if (shuffle_) shuffle_->reseed(epoch_seed_);
  }
  std::string describe() const override {
    if (!shuffle_options_) return {};
    return "shuffle window " + std::to_string(window_) + " seed " + std::to_string(seed_);
  }

  /// Exact resume, in deterministic mode, after begin_epoch() and while nothing runs: the
  /// consumer has taken the epoch's first `taken` items. A FIFO was then empty. A shuffle
  /// held the items its draws had not taken yet: which ones is found by drawing `taken` times
  /// from positions instead of items (the oldest-window rule depends on nothing else, and on
  /// `total`, the items it got in the epoch, once its input had ended); `remake(positions)`
  /// makes the items at those positions of the producer's output again, in that order, and
  /// they go back in the places they held. Returns the position, in the producer's output, of
  /// the first item it must push.
  template <class Remake>
  std::uint64_t resume(std::uint64_t taken, std::optional<std::uint64_t> total, Remake&& remake) {
    std::uint64_t pushed = taken;
    std::optional<ShuffleBuffer<T>> rebuilt;
    if (shuffle_) {
      ShuffleBuffer<std::uint64_t> draws(window_, epoch_seed_);
      pushed = 0;
      const std::uint64_t end = total.value_or(UINT64_MAX);
      for (std::uint64_t i = 0; i < taken; ++i) {
        while (pushed < end && draws.size() < window_) draws.push(pushed++);
        if (draws.size() == 0) break;  // the consumer took the whole epoch
        draws.take();
      }
      std::vector<std::uint64_t> held;
      held.reserve(draws.size());
      draws.for_each([&](std::uint64_t p) { held.push_back(p); });
      std::sort(held.begin(), held.end());
      std::vector<T> items = remake(held);
      rebuilt.emplace(draws.map([&](std::uint64_t p) {
        return std::move(items[static_cast<std::size_t>(std::lower_bound(held.begin(), held.end(), p) - held.begin())]);
      }));
    }
    std::lock_guard lock(mutex_);
    popped_ = taken;
    pushed_ = pushed;
    if (rebuilt) {
      Count counted(*this, +1);
      counted.n = rebuilt->size();
      shuffle_ = std::move(rebuilt);
    }
    return pushed;
  }

  /// Moves all of `items` in and empties it, or takes nothing and returns false (no room, or
  /// closed). `items.size()` must be at most max_chunk().
  bool try_push(std::vector<T>& items) {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      if (skip_ != 0) {
        const auto n = static_cast<std::ptrdiff_t>(std::min<std::uint64_t>(skip_, items.size()));
        items.erase(items.begin(), items.begin() + n);
        skip_ -= static_cast<std::uint64_t>(n);
      }
      if (closed_.load() || held_.load() + items.size() > capacity()) return false;
      Count counted(*this, +1);
      try {
        for (auto& v : items) {
          if (shuffle_)
            shuffle_->push(std::move(v));
          else
            fifo_.push_back(std::move(v));
          ++counted.n;
        }
      } catch (...) {  // a move threw: what went in stays in, and leaves `items`
        items.erase(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(counted.n));
        throw;
      }
      pushed_ += counted.n;
      counted.publish();
      wake = wake_consumer_locked();  // after held_ counts the items
    }
    items.clear();
    if (wake) wake_consumer();
    return true;
  }

  /// The producer has sent the epoch's last item: a shuffle drains its remainder.
  void end_epoch() {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      ended_.store(true);
      wake = consumer_waiting_;
    }
    if (wake) wake_consumer();
  }

  /// Appends up to `max` items to `out` (for a shuffle, drawn at random) and sets `first` to the
  /// position of the first of them in the epoch's stream. On `items`, `out` grew.
  Pop pop(std::vector<T>& out, std::size_t max, std::uint64_t& first) {
    std::lock_guard lock(mutex_);
    return pop_locked(out, max, first);
  }

  /// pop() for the consumer's thread, the only one that pops the last queue: waits while it
  /// would report `empty`.
  Pop pop_wait(std::vector<T>& out, std::size_t max, std::uint64_t& first) {
    std::unique_lock lock(mutex_);
    while (!ready()) {
      consumer_waiting_ = true;
      const std::uint32_t seen = signal_.load();  // under the lock: a wake-up after it changes it
      lock.unlock();
      signal_.wait(seen);
      lock.lock();
    }
    consumer_waiting_ = false;
    return pop_locked(out, max, first);
  }

 private:
  // Keeps held_ and the meter equal to what the container holds, also when a move throws.
  struct Count {
    Edge& edge;
    int sign;
    std::size_t n = 0;
    void publish() {
      if (n == 0) return;
      if (sign > 0) {
        edge.held_.store(edge.held_.load() + n);
        edge.count_in(n);
      } else {
        edge.held_.store(edge.held_.load() - n);
        edge.count_out(n);
      }
      n = 0;
    }
    ~Count() { publish(); }
  };

  Pop pop_locked(std::vector<T>& out, std::size_t max, std::uint64_t& first) {
    if (closed_.load()) return Pop::closed;
    const std::size_t n = std::min(max, poppable_locked());
    if (n == 0) return ended_.load() && held_.load() == 0 ? Pop::ended : Pop::empty;
    out.reserve(out.size() + n);
    first = popped_;
    Count counted(*this, -1);
    for (std::size_t i = 0; i < n; ++i) {
      if (shuffle_) {
        out.push_back(shuffle_->take());
      } else {
        out.push_back(std::move(fifo_.front()));
        fifo_.pop_front();
      }
      ++counted.n;
      ++popped_;
    }
    return Pop::items;
  }

  std::deque<T> fifo_;
  std::optional<ShuffleOptions> shuffle_options_;
  std::optional<ShuffleBuffer<T>> shuffle_;
  std::size_t window_ = 0;  // a shuffle's: what a take draws from
  std::uint64_t seed_ = 0, epoch_seed_ = 0;
};

}  // namespace stoker::detail
