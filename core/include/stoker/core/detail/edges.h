// SPDX-License-Identifier: Apache-2.0
// The queues between stages, as stages see them, and a stage's output. Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stoker/core/detail/futex.h"
#include "stoker/core/detail/spin_lock.h"
#include "stoker/core/queue_meter.h"
#include "stoker/core/random.h"
#include "stoker/core/random_shuffle_queue.h"
#include "stoker/core/state.h"

namespace stoker::detail {

/// Consecutive origins: first, first + 1, ..., first + count - 1.
struct Origins {
  std::uint64_t first = 0, count = 0;
};

/// Items on their way between stages, each with its origin: the position the stages before it
/// gave it in the epoch, which is what StageContext::index is for the stage that takes it. A
/// source numbers its items by call, a map keeps the number, a flat_map with a fanout k gives the
/// j-th output of input o the number o * k + j, a shuffle keeps it, a batch numbers its batches.
/// So an item's origin is the same on every run, whatever the threads and the order, and a
/// resume can make the item at any origin again (Producer::remake).
///
/// Origins are kept as runs of consecutive numbers, which is what a chunk holds but after a
/// shuffle: a run per chunk costs a FIFO queue nothing per item. A chunk without origins (a
/// flat_map with no fanout cannot number its outputs) is numbered by the queue, by arrival.
/// Removes the first `n` items of `v`, which need not be assignable (an item type with a const
/// member): erase() would move the rest down by assignment.
template <class V>
void erase_front(V& v, std::size_t n) {
  if constexpr (std::is_move_assignable_v<typename V::value_type>) {
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
  } else {
    V rest;
    rest.reserve(v.size() - n);
    for (std::size_t i = n; i < v.size(); ++i) rest.push_back(std::move(v[i]));
    v = std::move(rest);
  }
}

template <class T>
struct Chunk {
  std::vector<T> items;
  std::vector<Origins> runs;  // the items' origins in order; none at all: numbered by the queue

  std::size_t size() const noexcept { return items.size(); }
  bool empty() const noexcept { return items.empty(); }
  void clear() noexcept {
    items.clear();
    runs.clear();
  }
  void reserve(std::size_t n) { items.reserve(n); }
  void push(T&& item, std::uint64_t origin) {
    items.push_back(std::move(item));
    number(origin);
  }
  /// Gives the next item without an origin yet the origin `origin`.
  void number(std::uint64_t origin) { number(Origins{origin, 1}); }
  void number(Origins run) {
    if (!runs.empty() && runs.back().first + runs.back().count == run.first)
      runs.back().count += run.count;
    else
      runs.push_back(run);
  }
  /// Every item's origin, in order.
  std::vector<std::uint64_t> origin_list() const {
    std::vector<std::uint64_t> out;
    out.reserve(items.size());
    for (const Origins& r : runs)
      for (std::uint64_t i = 0; i < r.count; ++i) out.push_back(r.first + i);
    return out;
  }
};

/// Reads the origins of a chunk's items one by one, in order: next(chunk.runs) for each item.
class OriginCursor {
 public:
  std::uint64_t next(const std::vector<Origins>& runs) noexcept {
    while (runs[run_].count == offset_) ++run_, offset_ = 0;
    return runs[run_].first + offset_++;
  }

 private:
  std::size_t run_ = 0;
  std::uint64_t offset_ = 0;
};

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
///
/// What does not depend on the item type is here, and most of it out of line (edges.cpp): what
/// every user translation unit compiles for each item type is the typed queue alone.
class EdgeBase : public QueueMeter {
 public:
  /// A FIFO queue of `capacity` items.
  EdgeBase(std::string name, std::size_t capacity, std::string producer, std::string consumer);
  /// A random-shuffle buffer (RandomShuffleQueue's semantics).
  EdgeBase(std::string name, ShuffleOptions shuffle, std::string producer, std::string consumer);
  virtual ~EdgeBase();

  const std::string& producer() const { return producer_; }
  const std::string& consumer() const { return consumer_; }

  /// Called by build(): whether the pipeline is deterministic, and the seed a shuffle without
  /// one of its own derives its streams from.
  virtual void start(bool deterministic, std::uint64_t seed) = 0;
  /// Prepares epoch `epoch`; called while no stage body runs.
  virtual void begin_epoch(std::uint32_t epoch) = 0;

  /// Free places; none while the queue holds more than its capacity, as a resumed free-order
  /// run's queue may at first (Edge::resume).
  std::size_t room() const noexcept {
    const std::size_t held = held_.load();
    return held < capacity() ? capacity() - held : 0;
  }
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
  /// In free order only the items a shuffle holds count, not their order.
  std::string describe() const;
  /// When the producer has ended the epoch: the items the queue got in it.
  std::optional<std::uint64_t> input_total() {
    std::lock_guard lock(mutex_);
    return ended_.load() ? std::optional(pushed_) : std::nullopt;
  }
  /// Exact resume of the producer, a stage making `per_input` outputs of each input, whose
  /// outputs had been made up to `next`: the outputs of its first input that were made before
  /// (the consumer took them, or holds them again) are dropped as they are pushed. In
  /// deterministic mode `next` is a position: the first next % per_input pushes are dropped. In
  /// free order it is an origin: the items whose origin is below it are.
  void skip_made(std::uint64_t next, std::uint64_t per_input) {
    std::lock_guard lock(mutex_);
    if (deterministic_)
      skip_pushes_ = next % per_input;
    else
      skip_before_ = next;
  }

  /// Free order: a FIFO that a shuffle feeds (through stages) gives back, at a resume, the items
  /// not taken in a random order rather than in their origins' (which would put the crops of an
  /// image side by side, as they were made). Called by build().
  void put_back_shuffled() { put_back_shuffled_ = true; }

  /// For good (the pipeline stops): pops report `closed`, pushes fail, the consumer wakes.
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_.store(true);
    }
    wake_consumer();
  }

  /// A producer that holds `n` more (negative: fewer) items it could not push counts them here
  /// while it waits: reported beside the queue's size, never in it (QueueMeter::waiting()).
  void note_waiting(std::ptrdiff_t n) noexcept { count_waiting(n); }

  /// Items a consumer could take now: all it holds once the epoch's input has ended, otherwise
  /// those above the floor a shuffle keeps back. A recent value, read without the lock.
  std::size_t takeable() const noexcept {
    const std::size_t held = held_.load();
    return ended_.load() ? held : held > floor_ ? held - floor_ : 0;
  }
  /// What a shuffle keeps back while the epoch's input goes on (min_after_dequeue); 0 for a FIFO.
  std::size_t floor() const noexcept { return floor_; }

 protected:
  /// start(): the seed, and a shuffle's window. Deterministic mode draws from the oldest items
  /// (ShuffleRule::oldest_window), which does not depend on how far the producer ran ahead;
  /// free order from all held, as TensorFlow does.
  void configure(bool deterministic, std::uint64_t seed);

  /// What Edge::resume() puts back: the origin of the first item the producer must push, the
  /// items (by origin, ascending) the queue held, and for a deterministic shuffle its draws
  /// replayed on origins, which say where they go back.
  struct ResumePlan {
    std::uint64_t next = 0;
    std::vector<std::uint64_t> origins;
    std::optional<ShuffleBuffer<std::uint64_t>> draws;
  };
  ResumePlan plan_resume(std::uint64_t taken, const PipelineState& state) const;
  /// The order in which a FIFO's `n` items go back at a resume after `taken` (put_back_shuffled).
  std::vector<std::size_t> put_back_order(std::size_t n, std::uint64_t taken) const;

  // Under mutex_: items that may be taken now, exactly.
  std::size_t poppable_locked() const noexcept { return takeable(); }
  // Under mutex_, after making items poppable: whether the consumer's thread waits for them.
  bool wake_consumer_locked() const noexcept { return consumer_waiting_ && ready(); }
  // The consumer's thread sleeps on `signal_` (a futex): lighter than a condition variable,
  // whose notify contends with the waiter for the variable's own lock.
  void wake_consumer() noexcept { signal_.notify_one(); }
  // Under `lock` (on mutex_), for the consumer's thread: waits while a pop would report `empty`,
  // until `deadline` if there is one; true when a pop would not.
  template <class Lock>
  bool wait_ready(Lock& lock, const std::chrono::steady_clock::time_point* deadline) {
    while (!ready()) {
      const auto now = std::chrono::steady_clock::now();
      if (deadline && now >= *deadline) break;
      consumer_waiting_ = true;
      const std::uint32_t seen = signal_.value();  // under the lock: a wake-up after it changes it
      lock.unlock();
      if (deadline)
        signal_.wait(seen, *deadline - now);
      else
        signal_.wait(seen);
      lock.lock();
    }
    consumer_waiting_ = false;
    return ready();
  }

  const std::size_t floor_;                              // what a pop leaves behind while the epoch is open
  const std::optional<ShuffleOptions> shuffle_options_;  // none: a FIFO
  std::size_t window_ = 0;                               // a shuffle's: what a take draws from
  std::uint64_t seed_ = 0, epoch_seed_ = 0;
  SpinLock mutex_;
  Futex signal_;
  bool consumer_waiting_ = false;  // under mutex_
  std::uint64_t popped_ = 0;       // under mutex_: items taken this epoch
  std::uint64_t pushed_ = 0;       // under mutex_: items put this epoch (their positions)
  std::uint64_t skip_before_ = 0;  // under mutex_: pushed items below this origin are dropped
  std::uint64_t skip_pushes_ = 0;  // under mutex_: so many pushed items are dropped
  bool deterministic_ = false;
  bool put_back_shuffled_ = false;
  std::atomic<std::size_t> held_{0};
  std::atomic<bool> ended_{false}, closed_{false};

 private:
  std::string producer_, consumer_;
};

template <class T>
class Edge final : public EdgeBase {
 public:
  using EdgeBase::EdgeBase;

  ~Edge() override { destroy_held_locked(); }

  void start(bool deterministic, std::uint64_t seed) override {
    configure(deterministic, seed);
    if (shuffle_options_) shuffle_.emplace(window_, seed_);
  }
  void begin_epoch(std::uint32_t epoch) override {
    std::lock_guard lock(mutex_);
    ended_.store(false);
    popped_ = pushed_ = skip_before_ = skip_pushes_ = 0;
    epoch_seed_ = derive_seed(seed_, epoch);
    if (shuffle_) shuffle_->reseed(epoch_seed_);
  }
  /// Exact resume, after begin_epoch() and while nothing runs: the consumer has taken the
  /// epoch's first `taken` items. Puts back what the queue held then, which `remake(origins)`
  /// makes again (the items of those origins, ascending), and returns the origin of the first
  /// item the producer must push.
  /// - A FIFO in deterministic mode was empty: its items leave in order.
  /// - A shuffle in deterministic mode held the items its draws had not taken yet: which ones is
  ///   found by drawing `taken` times from origins instead of items (the oldest-window rule
  ///   depends on nothing else, and on the items it got in the epoch once its input had ended,
  ///   state.shuffle_inputs); they go back in the places they held.
  /// - In free order the queue the consumer's items are traced to (state.taken) gets back every
  ///   item below state.taken->below that the consumer had not taken, wherever it was: this
  ///   queue or one before, a stage, a batch being made. That may be more than its capacity
  ///   (never more than the pipeline held); it takes no more until it is under. Every other
  ///   queue starts empty.
  template <class Remake>
  std::uint64_t resume(std::uint64_t taken, const PipelineState& state, Remake&& remake) {
    ResumePlan plan = plan_resume(taken, state);
    const auto& origins = plan.origins;
    std::vector<T> items = origins.empty() ? std::vector<T>() : remake(origins);
    std::unique_lock lock(mutex_);
    popped_ = taken;
    if (plan.draws) {
      const std::vector<Slot*> slots = acquire_locked(items.size());
      std::size_t filled = 0;
      try {
        for (; filled < slots.size(); ++filled) slots[filled]->fill(std::move(items[filled]), origins[filled]);
        auto drawn = plan.draws->map([&](std::uint64_t p) {
          return slots[static_cast<std::size_t>(std::lower_bound(origins.begin(), origins.end(), p) - origins.begin())];
        });
        destroy_held_locked();
        shuffle_ = std::move(drawn);
      } catch (...) {  // a move or an allocation threw: the queue holds what it held
        for (std::size_t i = 0; i < filled; ++i) slots[i]->empty();
        free_.insert(free_.end(), slots.begin(), slots.end());
        throw;
      }
      Count(*this, +1, slots.size()).publish();
    } else {
      Chunk<T> back;
      for (const auto i : put_back_order(items.size(), taken)) back.push(std::move(items[i]), origins[i]);
      put(lock, back);
    }
    pushed_ = plan.next;
    return plan.next;
  }

  /// Moves all of `chunk` in and empties it, or takes nothing and returns false (no room, or
  /// closed). `chunk.size()` must be at most max_chunk().
  bool try_push(Chunk<T>& chunk) {
    bool wake = false;
    {
      std::unique_lock lock(mutex_);
      if (skip_before_ != 0 && !chunk.runs.empty()) drop_before(chunk, skip_before_);
      if (skip_pushes_ != 0) skip_pushes_ -= drop_first(chunk, skip_pushes_);
      if (closed_.load() || held_.load() + filling_ + chunk.size() > capacity()) return false;
      if (chunk.runs.empty() && !chunk.empty()) chunk.runs.push_back({pushed_, chunk.size()});  // by arrival
      put(lock, chunk);
      wake = wake_consumer_locked();  // after held_ counts the items
    }
    chunk.clear();
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

  /// Appends up to `max` items to `out` (for a shuffle, drawn at random), with their origins,
  /// and sets `first` to the position of the first of them in the order taken this epoch. On
  /// `items`, `out` grew.
  Pop pop(Chunk<T>& out, std::size_t max, std::uint64_t& first) {
    std::unique_lock lock(mutex_);
    return pop_locked(lock, out, max, first);
  }

  /// pop() for the consumer's thread, the only one that pops the last queue: waits while it
  /// would report `empty`.
  Pop pop_wait(Chunk<T>& out, std::size_t max, std::uint64_t& first) {
    std::unique_lock lock(mutex_);
    wait_ready(lock, nullptr);
    return pop_locked(lock, out, max, first);
  }

  /// For the consumer's thread: waits until a pop would not report `empty`, or until `deadline`;
  /// true when it would not.
  bool wait_until(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    return wait_ready(lock, &deadline);
  }

 private:
  // A shuffle's items live in slots that stay where they are while held: its draws
  // (ShuffleBuffer) move pointers to slots under the lock, and the items are moved into and out
  // of their slots with the lock released. A slot belongs to one party at a time:
  //   free (free_) -> a pusher's, being filled -> held (shuffle_) -> a taker's, being emptied -> free
  // so no two threads touch one slot at once, and the lock is never held across the item moves,
  // whose cache lines another core has just written (on 16 cores those moves, under the lock,
  // were most of what bounded the pipeline: docs/benchmarks.md). A slot is a cache line or more,
  // so a slot being filled and one being emptied never share a line.
  struct alignas(64) Slot {
    union {
      T value;  // constructed while the slot is being filled, held or being emptied
    };
    std::uint64_t origin = 0;
    Slot() {}
    ~Slot() {}
    void fill(T&& item, std::uint64_t at) {
      std::construct_at(&value, std::move(item));
      origin = at;
    }
    void empty() noexcept { std::destroy_at(&value); }
  };

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

  // Drops the first `n` items of `chunk`; returns how many it dropped.
  static std::uint64_t drop_first(Chunk<T>& chunk, std::uint64_t n) {
    n = std::min<std::uint64_t>(n, chunk.size());
    if (chunk.runs.empty()) {  // numbered by arrival
      erase_front(chunk.items, n);
      return n;
    }
    Chunk<T> kept;
    OriginCursor o;
    std::uint64_t i = 0;
    for (auto&& item : chunk.items)
      if (const auto at = o.next(chunk.runs); i++ >= n) kept.push(std::move(item), at);
    chunk = std::move(kept);
    return n;
  }

  // Keeps the items whose origin is at least `origin`, with their origins.
  static void drop_before(Chunk<T>& chunk, std::uint64_t origin) {
    Chunk<T> kept;
    OriginCursor o;
    for (auto&& item : chunk.items)
      if (const auto at = o.next(chunk.runs); at >= origin) kept.push(std::move(item), at);
    chunk = std::move(kept);
  }

  // Under `lock` (on mutex_), which a shuffle releases while it moves the items: moves the items
  // of `chunk` (numbered) in, counts them (pushed_, held_, the meter) and empties `chunk`. A move
  // that throws leaves what went in in, counted, and the rest in `chunk`. Pushes come one at a
  // time, from the producer's Output under its lock (and resume(), while nothing runs), so
  // those of a shuffle arrive in the order they began.
  void put(std::unique_lock<SpinLock>& lock, Chunk<T>& chunk) {
    Count counted(*this, +1);
    if (shuffle_) {
      const std::vector<Slot*> slots = acquire_locked(chunk.size());
      filling_ += slots.size();
      lock.unlock();
      std::size_t n = 0;
      try {
        OriginCursor o;
        for (auto&& v : chunk.items) {
          prefetch(slots, n);
          slots[n++]->fill(std::move(v), o.next(chunk.runs));
        }
      } catch (...) {  // slots[n - 1] threw: the slots before it are filled
        lock.lock();
        filling_ -= slots.size();
        for (std::size_t i = 0; i < slots.size(); ++i)
          (i + 1 < n ? shuffle_->push(slots[i]) : free_.push_back(slots[i]));
        keep_unput(chunk, n - 1, chunk.origin_list());
        counted.n = n - 1;
        throw;
      }
      lock.lock();
      filling_ -= slots.size();
      for (Slot* s : slots) shuffle_->push(s);
      counted.n = n;
    } else {
      try {
        for (auto&& v : chunk.items) {
          fifo_.push_back(std::move(v));
          ++counted.n;
        }
      } catch (...) {
        const auto numbered = chunk.origin_list();  // the runs of the items that went in, for their pops
        for (std::size_t i = 0; i < counted.n; ++i) fifo_runs_.push_back({numbered[i], 1});
        keep_unput(chunk, counted.n, numbered);
        throw;
      }
      for (const Origins& r : chunk.runs)
        if (!fifo_runs_.empty() && fifo_runs_.back().first + fifo_runs_.back().count == r.first)
          fifo_runs_.back().count += r.count;
        else
          fifo_runs_.push_back(r);
    }
    pushed_ += counted.n;
    counted.publish();
    chunk.clear();
  }
  // A put whose n-th move threw: counts the `n` items that went in and leaves the rest in `chunk`,
  // whose origins were `numbered`.
  void keep_unput(Chunk<T>& chunk, std::size_t n, const std::vector<std::uint64_t>& numbered) {
    erase_front(chunk.items, n);
    chunk.runs.clear();
    for (std::size_t i = n; i < numbered.size(); ++i) chunk.number(numbered[i]);
    pushed_ += n;
  }

  // Under `lock` (on mutex_), which a shuffle releases while it moves the items out. A move
  // that throws leaves what was taken out taken, each item in `out` with its origin, and the
  // rest held: the counts, the origins and what the queue holds stay in step.
  Pop pop_locked(std::unique_lock<SpinLock>& lock, Chunk<T>& out, std::size_t max, std::uint64_t& first) {
    if (closed_.load()) return Pop::closed;
    const std::size_t n = std::min(max, poppable_locked());
    if (n == 0) return ended_.load() && held_.load() == 0 ? Pop::ended : Pop::empty;
    out.reserve(out.size() + n);
    first = popped_;
    if (shuffle_) {
      std::vector<Slot*> slots(n);
      for (Slot*& s : slots) s = shuffle_->take();
      popped_ += n;
      Count(*this, -1, n).publish();
      lock.unlock();
      std::size_t moved = 0;
      try {
        out.runs.reserve(out.runs.size() + n);
        for (; moved < n; ++moved) {
          prefetch(slots, moved);
          Slot& s = *slots[moved];
          out.push(std::move(s.value), s.origin);
          s.empty();
        }
      } catch (...) {  // slots[moved] threw: it and the slots after it are held again
        lock.lock();
        for (std::size_t i = 0; i < n; ++i) (i < moved ? free_.push_back(slots[i]) : shuffle_->push(slots[i]));
        popped_ -= n - moved;
        Count(*this, +1, n - moved).publish();
        throw;
      }
      lock.lock();
      free_.insert(free_.end(), slots.begin(), slots.end());
      return Pop::items;
    }
    Count counted(*this, -1);
    try {
      for (std::size_t i = 0; i < n; ++i, ++counted.n) {
        out.items.push_back(std::move(fifo_.front()));
        fifo_.pop_front();
      }
    } catch (...) {
      number_popped(out, counted.n);
      popped_ += counted.n;
      throw;
    }
    number_popped(out, n);
    popped_ += n;
    return Pop::items;
  }

  // Under mutex_: the origins of the `n` items just moved from the FIFO into `out`.
  void number_popped(Chunk<T>& out, std::size_t n) {
    for (std::size_t left = n; left != 0;) {
      Origins& r = fifo_runs_.front();
      const std::uint64_t k = std::min<std::uint64_t>(r.count, left);
      out.number(Origins{r.first, k});
      r.first += k;
      r.count -= k;
      left -= static_cast<std::size_t>(k);
      if (r.count == 0) fifo_runs_.pop_front();
    }
  }

  // Slots are filled and emptied in the order of a list drawn beforehand, and each was last
  // written by another core: asking early for the line of the slot 8 on, to write it, overlaps
  // those misses instead of taking them one after the other (on 16 cores, 0.73-0.80 of the loop
  // without it, 0.85-0.97 with it: docs/benchmarks.md).
  static void prefetch(const std::vector<Slot*>& slots, std::size_t i) noexcept {
    constexpr std::size_t kAhead = 8;
    if (i + kAhead < slots.size()) __builtin_prefetch(slots[i + kAhead], 1);
  }
  // Under mutex_: `n` free slots, made when there are not so many.
  std::vector<Slot*> acquire_locked(std::size_t n) {
    while (free_.size() < n) free_.push_back(&slots_.emplace_back());
    std::vector<Slot*> out(free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
    free_.resize(free_.size() - n);
    return out;
  }
  // Under mutex_, or while nothing runs: empties the held slots.
  void destroy_held_locked() noexcept {
    if (!shuffle_) return;
    shuffle_->for_each([](Slot* s) { s->empty(); });
  }

  std::deque<T> fifo_;
  std::deque<Origins> fifo_runs_;  // the origins of fifo_'s items, in order
  std::optional<ShuffleBuffer<Slot*>> shuffle_;
  // A shuffle's slots, where they stay (a deque's growth moves none): as many as it may hold
  // (its capacity, or what a resume put back) and its takes are emptying, at most.
  std::deque<Slot> slots_;
  std::vector<Slot*> free_;  // under mutex_: slots with no item
  std::size_t filling_ = 0;  // under mutex_: slots being filled, which count against the capacity
};

}  // namespace stoker::detail
