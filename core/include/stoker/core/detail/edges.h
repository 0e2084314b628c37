// The queues between stages, as stages see them. Internal to the pipeline.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <vector>

#include "stoker/core/bounded_queue.h"
#include "stoker/core/random.h"
#include "stoker/core/random_shuffle_queue.h"

namespace stoker::detail {

/// An item, or the end-of-epoch marker when `value` is empty. `seq` numbers the items of
/// an epoch densely from 0 (the marker gets the count); only deterministic mode uses it.
template <class T>
struct Envelope {
  std::optional<T> value;
  std::uint64_t seq = 0;
};

enum class Pop { item, empty, closed };

/// Tells when all of an epoch's items have arrived. The end-of-epoch marker carries how
/// many items were sent before it, because it can overtake some of them: moodycamel keeps
/// order per producing thread only, and a stage's bodies run on several.
class ArrivalCount {
 public:
  ArrivalCount() = default;
  /// Not thread-safe: for moving a pipeline that no other thread is using.
  ArrivalCount(ArrivalCount&& o) noexcept : arrived_(o.arrived_.load()), expected_(o.expected_.load()) {}
  ArrivalCount& operator=(ArrivalCount&& o) noexcept {
    arrived_.store(o.arrived_.load());
    expected_.store(o.expected_.load());
    return *this;
  }
  void item() { arrived_.fetch_add(1); }
  void items(std::uint64_t n) {
    if (n != 0) arrived_.fetch_add(n);
  }
  void marker(std::uint64_t sent) { expected_.store(sent); }
  bool complete() const { return arrived_.load() == expected_.load(); }
  void reset() {
    arrived_.store(0);
    expected_.store(kUnknown);
  }

 private:
  static constexpr std::uint64_t kUnknown = ~std::uint64_t{0};
  std::atomic<std::uint64_t> arrived_{0};
  std::atomic<std::uint64_t> expected_{kUnknown};
};

/// What the pipeline needs of an edge whatever its item type.
class EdgeBase {
 public:
  EdgeBase(std::string producer, std::string consumer)
      : producer_(std::move(producer)), consumer_(std::move(consumer)) {}
  virtual ~EdgeBase() = default;
  /// Starts epoch `epoch`. Called only while no stage is running.
  virtual void begin_epoch(std::uint32_t epoch) = 0;
  /// Aborts the stream for good: pops report `closed`, waiters wake.
  virtual void close() = 0;
  virtual const QueueMeter& meter() const = 0;

  const std::string& producer() const { return producer_; }
  const std::string& consumer() const { return consumer_; }

 private:
  std::string producer_, consumer_;
};

/// A named, bounded edge of the graph. Stages only ever try: nothing here blocks a
/// oneTBB worker, except `pop_wait`, which only the consumer's own thread calls.
template <class T>
class Edge : public EdgeBase {
 public:
  using EdgeBase::EdgeBase;

  /// Moves from `e` only on success. Calls for one epoch arrive in `seq` order in
  /// deterministic mode (the producer serialises them).
  virtual bool try_push(Envelope<T>& e) = 0;
  virtual Pop try_pop(Envelope<T>& e) = 0;
  /// Pushes a prefix of `items`, all of them items (no end-of-epoch marker), moving from
  /// them; returns its length. One claim of room for the lot.
  virtual std::size_t try_push_many(std::span<Envelope<T>> items) = 0;
  /// Appends up to `max` envelopes to `out`, as that many try_pop calls would; reports
  /// `item` when it appended any.
  virtual Pop try_pop_many(std::vector<Envelope<T>>& out, std::size_t max) = 0;
  /// Claims up to `max` slots for items that push_reserved will push, so that a producer
  /// making several items counts them against the capacity before it makes them. Returns
  /// how many, 0 when full or when this edge takes no reservations (push one at a time).
  virtual std::size_t try_reserve(std::size_t /*max*/) { return 0; }
  /// Pushes `items`, all of them items, into as many slots claimed by try_reserve, moving
  /// from them. Never waits; drops them if the edge was closed meanwhile (stopping).
  virtual void push_reserved(std::span<Envelope<T>> /*items*/) {}
  /// Hands back `n` claimed slots that no item will fill.
  virtual void cancel_reserved(std::size_t /*n*/) {}
  /// True when `try_pop` would not return `empty`.
  virtual bool ready() const = 0;
  /// True when a blocked producer should resume: the edge is at most half full. Waiting
  /// for half rather than for one free slot makes the producer run in bursts instead of
  /// being woken, and put back to sleep, once per item that the consumer takes.
  bool has_room() const { return occupied() <= meter().capacity() / 2; }
  /// The items that count against the capacity.
  virtual std::size_t occupied() const { return meter().size(); }
};

/// A BoundedQueue edge. In deterministic mode it hands items out in `seq` order: pushes
/// arrive in order, but moodycamel only keeps order per producing thread, so a pop may
/// see a later item first and must hold it back. A held-back item still counts against
/// the capacity until it is handed out: otherwise the room it left in the queue would let
/// the producer run up to a whole capacity further ahead, again and again.
template <class T>
class QueueEdge final : public Edge<T> {
 public:
  QueueEdge(std::string name, std::size_t capacity, bool in_order, std::string producer, std::string consumer)
      : Edge<T>(std::move(producer), std::move(consumer)), queue_(std::move(name), capacity), in_order_(in_order) {}

  bool try_push(Envelope<T>& e) override { return room() != 0 && queue_.try_push(std::move(e)); }
  std::size_t try_push_many(std::span<Envelope<T>> items) override {
    return queue_.try_push_many(items.begin(), std::min(items.size(), room()));
  }
  // Only in free order: in order, room() is the bound, and reservations would escape it.
  std::size_t try_reserve(std::size_t max) override {
    if (in_order_) return 0;
    const std::size_t k = queue_.try_reserve(max);
    reserved_.fetch_add(k);
    return k;
  }
  // Reserved slots are counted until they are filled or handed back, never less.
  void push_reserved(std::span<Envelope<T>> items) override {
    queue_.push_reserved(items.begin(), items.size());
    reserved_.fetch_sub(items.size());
  }
  void cancel_reserved(std::size_t n) override {
    queue_.cancel_reserved(n);
    reserved_.fetch_sub(n);
  }
  // Reserved slots are occupied: a producer that waits for room must not see it in them.
  std::size_t occupied() const override {
    // The queue first: an item moving from it to held_back_ is then counted once or twice,
    // never missed (but for the moment it spends in the popping thread's hands).
    const std::size_t queued = queue_.size();
    return queued + held_.load() + reserved_.load();
  }

  Pop try_pop(Envelope<T>& e) override {
    if (!in_order_) return queue_.try_pop(e) ? Pop::item : (queue_.drained() ? Pop::closed : Pop::empty);
    std::lock_guard lock(order_mutex_);
    return pop_in_order(e);
  }
  Pop try_pop_many(std::vector<Envelope<T>>& out, std::size_t max) override {
    if (!in_order_) return queue_.try_pop_many(out, max) ? Pop::item : (queue_.drained() ? Pop::closed : Pop::empty);
    std::lock_guard lock(order_mutex_);
    Pop r = Pop::empty;
    std::size_t n = 0;
    for (; n < max; ++n) {
      Envelope<T> e;
      if ((r = pop_in_order(e)) != Pop::item) break;
      out.push_back(std::move(e));
    }
    return n == 0 ? r : Pop::item;
  }

  /// Blocking pop for the consumer's thread (the only one popping this edge). In order, it
  /// may take items that must wait for an earlier one; it calls `took()` after each item it
  /// takes out of the queue, so that the caller can wake a producer that waits for room,
  /// perhaps with that earlier item.
  template <class Took>
  bool pop_wait(Envelope<T>& e, Took&& took) {
    if (!in_order_) return queue_.pop(e);
    for (;;) {
      {
        std::lock_guard lock(order_mutex_);
        if (take_held_back(e)) return true;
      }
      Envelope<T> x;
      const bool got = queue_.pop(x);  // not under the lock: a producer's wake-up may need ready()
      std::lock_guard lock(order_mutex_);
      if (!got) return take_held_back(e);  // closed and drained
      took();
      if (deliver_or_hold(x, e)) return true;
    }
  }

  bool ready() const override {
    if (queue_.size() > 0 || queue_.drained()) return true;
    if (!in_order_) return false;
    std::lock_guard lock(order_mutex_);
    return held_back_.count(next_seq_) != 0;
  }
  void begin_epoch(std::uint32_t) override {
    // Locked: a body that has just left may still be asking ready().
    std::lock_guard lock(order_mutex_);
    next_seq_ = 0;
    held_back_.clear();
    held_.store(0);
  }
  void close() override { queue_.close(); }
  const QueueMeter& meter() const override { return queue_; }

 private:
  // Free slots, as far as the producer may use them: pushes to an in-order edge are
  // serialised, so no other push can take them between this and the push.
  std::size_t room() const {
    if (!in_order_) return std::numeric_limits<std::size_t>::max();  // the queue's own bound
    const std::size_t used = occupied();
    return used < queue_.capacity() ? queue_.capacity() - used : 0;
  }
  // Under order_mutex_.
  void hold(Envelope<T>&& x) {
    held_back_.emplace(x.seq, std::move(x));
    held_.store(held_back_.size());
  }
  // Under order_mutex_: the next item in order, if it was held back.
  bool take_held_back(Envelope<T>& e) {
    const auto it = held_back_.find(next_seq_);
    if (it == held_back_.end()) return false;
    e = std::move(it->second);
    held_back_.erase(it);
    held_.store(held_back_.size());
    ++next_seq_;
    return true;
  }

  // Under order_mutex_: try_pop in order.
  Pop pop_in_order(Envelope<T>& e) {
    for (;;) {
      if (take_held_back(e)) return Pop::item;
      Envelope<T> x;
      if (!queue_.try_pop(x)) return queue_.drained() ? Pop::closed : Pop::empty;
      if (deliver_or_hold(x, e)) return Pop::item;
    }
  }
  // Under order_mutex_: `x`, just popped, into `e` if it is next in order, else held back.
  bool deliver_or_hold(Envelope<T>& x, Envelope<T>& e) {
    if (x.seq != next_seq_) {
      hold(std::move(x));
      return false;
    }
    e = std::move(x);
    ++next_seq_;
    return true;
  }

  BoundedQueue<Envelope<T>> queue_;
  const bool in_order_;
  mutable std::mutex order_mutex_;
  std::uint64_t next_seq_ = 0;
  std::map<std::uint64_t, Envelope<T>> held_back_;
  std::atomic<std::size_t> held_{0};  // held_back_.size(), for occupied() without the lock
  std::atomic<std::size_t> reserved_{0};  // claimed by try_reserve, not yet filled or handed back
};

/// A RandomShuffleQueue edge. The end-of-epoch marker closes the queue so that the
/// remainder drains; the marker comes out after the last item, and the next epoch
/// reopens the queue with a seed derived from the pipeline seed and the epoch.
template <class T>
class ShuffleEdge final : public Edge<T> {
 public:
  ShuffleEdge(std::string name, ShuffleOptions options, std::string producer, std::string consumer)
      : Edge<T>(std::move(producer), std::move(consumer)),
        seed_(options.seed),
        queue_(std::move(name), {options.capacity, options.min_after_dequeue, derive_seed(options.seed, 0)}) {}

  bool try_push(Envelope<T>& e) override {
    if (!e.value) {
      queue_.close();
      return true;
    }
    return queue_.try_push(std::move(*e.value));
  }
  std::size_t try_push_many(std::span<Envelope<T>> items) override {
    auto values = items | std::views::transform([](Envelope<T>& e) -> T&& { return std::move(*e.value); });
    return queue_.try_push_many(values.begin(), values.end());
  }

  Pop try_pop(Envelope<T>& e) override {
    std::lock_guard lock(pop_mutex_);  // so that `seq` follows the pop order
    if (aborted_.load()) return Pop::closed;
    if (auto value = queue_.try_pop()) {
      e.value = std::move(value);
      e.seq = popped_++;
      return Pop::item;
    }
    return end_of_epoch(e);
  }
  Pop try_pop_many(std::vector<Envelope<T>>& out, std::size_t max) override {
    std::lock_guard lock(pop_mutex_);
    if (aborted_.load()) return Pop::closed;
    popped_values_.clear();
    if (queue_.try_pop_some(popped_values_, max) != 0) {
      for (T& v : popped_values_) out.push_back({std::move(v), popped_++});
      return Pop::item;
    }
    Envelope<T> marker;
    const Pop r = end_of_epoch(marker);
    if (r == Pop::item) out.push_back(std::move(marker));
    return r;
  }

  bool ready() const override { return aborted_.load() || (!marker_sent_.load() && queue_.ready()); }
  void begin_epoch(std::uint32_t epoch) override {
    if (epoch != 0) queue_.reopen(derive_seed(seed_, epoch));
    popped_ = 0;
    marker_sent_.store(false);
  }
  void close() override {
    aborted_.store(true);
    queue_.close();
  }
  const QueueMeter& meter() const override { return queue_; }

 private:
  // Under pop_mutex_, when nothing may be popped: the end-of-epoch marker, once drained.
  Pop end_of_epoch(Envelope<T>& e) {
    if (!queue_.drained() || marker_sent_.load()) return Pop::empty;
    marker_sent_.store(true);
    e.value.reset();
    e.seq = popped_;
    return Pop::item;
  }

  const std::uint64_t seed_;
  RandomShuffleQueue<T> queue_;
  std::mutex pop_mutex_;
  std::vector<T> popped_values_;  // reused under pop_mutex_
  std::uint64_t popped_ = 0;
  std::atomic<bool> marker_sent_{false};
  std::atomic<bool> aborted_{false};
};

/// A stage's output: pushes to the edge when it has room, otherwise parks the envelope
/// here so the stage's body can return instead of waiting. Envelopes leave in the order
/// they were emitted. A stage with parked envelopes takes no new input: that is
/// backpressure, and it bounds what a stage holds to one input's outputs per body.
template <class T>
class Output {
 public:
  void attach(Edge<T>* edge) { edge_ = edge; }

  void emit(Envelope<T>&& e) {
    if (parked_.load() == 0 && edge_->try_push(e)) return;
    std::lock_guard lock(mutex_);
    parking_.push_back(std::move(e));
    parked_.fetch_add(1);
    flush_locked();
  }
  /// emit() for each of `items` (no end-of-epoch marker among them), in one push when the
  /// edge has room for them all. Leaves `items` empty.
  void emit_many(std::vector<Envelope<T>>& items) {
    const std::size_t pushed = parked_.load() == 0 ? edge_->try_push_many(items) : 0;
    if (pushed != items.size()) {
      std::lock_guard lock(mutex_);
      for (auto it = items.begin() + static_cast<std::ptrdiff_t>(pushed); it != items.end(); ++it)
        parking_.push_back(std::move(*it));
      parked_.fetch_add(items.size() - pushed);
      flush_locked();
    }
    items.clear();
  }
  /// Edge::try_reserve, while nothing is parked (parked envelopes leave first).
  std::size_t try_reserve(std::size_t max) { return parked_.load() == 0 ? edge_->try_reserve(max) : 0; }
  void push_reserved(std::span<Envelope<T>> items) { edge_->push_reserved(items); }
  void cancel_reserved(std::size_t n) { edge_->cancel_reserved(n); }
  /// Pushes what is parked, as far as the edge has room. True when nothing is left.
  bool flush() {
    if (parked_.load() == 0) return true;
    std::lock_guard lock(mutex_);
    flush_locked();
    return parking_.empty();
  }
  bool blocked() const { return parked_.load() != 0; }
  /// Work for the stage: nothing parked, or room (see Edge::has_room) for what is.
  bool can_move() const { return parked_.load() == 0 || edge_->has_room(); }

 private:
  void flush_locked() {
    while (!parking_.empty() && edge_->try_push(parking_.front())) {
      parking_.pop_front();
      parked_.fetch_sub(1);
    }
  }

  Edge<T>* edge_ = nullptr;
  std::mutex mutex_;
  std::deque<Envelope<T>> parking_;
  std::atomic<std::size_t> parked_{0};
};

}  // namespace stoker::detail
