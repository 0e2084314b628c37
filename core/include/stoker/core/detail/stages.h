// The typed stages: a source, 1 -> k transforms, and a batcher. Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "stoker/core/detail/edges.h"
#include "stoker/core/detail/runtime.h"

namespace stoker {

/// What a flat_map function emits its outputs through.
template <class T>
class Emitter {
 public:
  explicit Emitter(std::vector<T>& out) : out_(out) {}
  void operator()(T value) { out_.push_back(std::move(value)); }

 private:
  std::vector<T>& out_;
};

namespace detail {

/// Calls `f(args..., context)` if `f` takes a StageContext last, else `f(args...)`.
template <class F, class... Args>
decltype(auto) call_with_context(F& f, const StageContext& ctx, Args&&... args) {
  if constexpr (std::is_invocable_v<F&, Args..., const StageContext&>)
    return f(std::forward<Args>(args)..., ctx);
  else
    return f(std::forward<Args>(args)...);
}

/// A stage that emits T into an edge and wakes the stage that pops it.
template <class T>
class Producer : public StageBase {
 public:
  using StageBase::StageBase;
  void connect_output(Edge<T>* edge, StageBase* consumer) {
    out_.attach(edge);
    downstream_ = consumer;
  }

 protected:
  /// Sends an item, numbered `seq` (deterministic mode), or the end-of-epoch marker
  /// when `e.value` is empty, which then carries the number of items sent this epoch.
  void emit(Envelope<T>&& e) {
    if (e.value)
      sent_.fetch_add(1);
    else
      e.seq = sent_.load();
    out_.emit(std::move(e));
    if (downstream_) downstream_->wake();
  }
  /// emit() for each of `items`, all of them items, with one wake-up. Leaves `items` empty.
  void emit_many(std::vector<Envelope<T>>& items) {
    if (items.empty()) return;
    sent_.fetch_add(items.size());
    out_.emit_many(items);
    if (downstream_) downstream_->wake();
  }
  void end_epoch() { emit({std::nullopt, 0}); }

  // Bursts. A source, and a map in free order, make several items per step: as many as the
  // output has room for, up to about kBurstTime of the function's work. The queue operations
  // and wake-ups, which are most of what an item of a cheap stage costs and a good part of a
  // slow one's, are then paid once per burst. A burst that runs past twice that time (the
  // function got slower) hands on what it has made at once. The items go into slots claimed before they
  // are made, so what a body holds meanwhile counts against the output's capacity. They
  // leave together at the end of the burst, or when the function polls stop_requested()
  // (see there), so that a function waiting for something downstream gives back never
  // waits for what its own body holds.
  static constexpr std::chrono::nanoseconds kBurstTime = std::chrono::microseconds(100);
  static constexpr std::size_t kMaxBurst = 32;

  /// Items made in one burst, into `reserved` slots claimed with out_.try_reserve; the slots
  /// they do not fill are handed back at the end.
  class Burst final : public HeldOutputs {
   public:
    Burst(Producer& producer, std::size_t reserved) : producer_(producer), reserved_(reserved) {
      try {
        items_.reserve(reserved);
      } catch (...) {
        producer_.out_.cancel_reserved(reserved);
        throw;
      }
      previous_ = hold_outputs(this);  // last: the destructor, which restores it, now runs
    }
    ~Burst() {
      hold_outputs(previous_);
      producer_.out_.cancel_reserved(reserved_ - sent_);  // none after finish()
    }
    Burst(const Burst&) = delete;
    Burst& operator=(const Burst&) = delete;

    std::size_t room() const { return reserved_ - items_.size(); }
    /// Adds an item. Past twice kBurstTime (the function got slower than its average), hands
    /// the items on at once rather than keep them from the stages downstream; false then.
    bool add(T&& value) {
      items_.push_back({std::move(value), 0});
      if (Clock::now() - started_ < 2 * kBurstTime) return true;
      push_held();
      return false;
    }
    /// Pushes what is left, hands back the slots no item came for, and times the burst.
    void finish() {
      push_held();
      producer_.out_.cancel_reserved(room());
      reserved_ = items_.size();
      if (items_.empty()) return;
      const auto n = static_cast<std::int64_t>(items_.size());
      const auto per_item = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started_).count() / n;
      auto& avg = producer_.item_ns_;
      avg.store((3 * avg.load(std::memory_order_relaxed) + per_item) / 4, std::memory_order_relaxed);
    }
    void push_held() override {
      const auto held = std::span(items_).subspan(sent_);
      if (held.empty()) return;
      producer_.sent_.fetch_add(held.size());
      sent_ = items_.size();  // before the push: a push that throws has handed its slots back
      producer_.out_.push_reserved(held);
      if (producer_.downstream_) producer_.downstream_->wake();
    }

   private:
    using Clock = std::chrono::steady_clock;
    Producer& producer_;
    std::size_t reserved_, sent_ = 0;
    HeldOutputs* previous_ = nullptr;
    const Clock::time_point started_ = Clock::now();
    std::vector<Envelope<T>> items_;
  };

  /// Items for the next burst, from the function's recent time per item.
  std::size_t burst_size() const {
    const auto per_item = std::max<std::int64_t>(item_ns_.load(std::memory_order_relaxed), 1);
    return std::clamp<std::size_t>(static_cast<std::size_t>(kBurstTime.count() / per_item), 1, kMaxBurst);
  }
  /// Pushes what the output holds back. True when nothing is left.
  bool flush() {
    if (!out_.blocked()) return true;
    const bool clear = out_.flush();
    if (downstream_) downstream_->wake();
    return clear;
  }
  void begin_epoch(std::uint32_t epoch) override {
    StageBase::begin_epoch(epoch);
    sent_.store(0);
  }
  bool output_blocked() const override { return out_.blocked(); }
  Output<T> out_;

 private:
  StageBase* downstream_ = nullptr;  // none for the last stage: the consumer pops
  std::atomic<std::uint64_t> sent_{0};
  // The function's time per item, averaged over recent bursts. Starts at kBurstTime, so
  // that the first burst is of one item.
  std::atomic<std::int64_t> item_ns_{kBurstTime.count()};
};

/// Calls the user's source until it returns nullopt, which ends the epoch.
template <class T, class F>
class SourceStage final : public Producer<T> {
  using Step = StageBase::Step;

 public:
  SourceStage(PipelineCore& core, std::string name, F fn) : Producer<T>(core, std::move(name), 1), fn_(std::move(fn)) {}

  void begin_epoch(std::uint32_t epoch) override {
    Producer<T>::begin_epoch(epoch);
    exhausted_.store(false);
    seq_ = 0;
  }

 protected:
  Step step() override {
    if (!this->flush()) return Step::blocked;
    if (exhausted_.load()) return Step::done;
    if (const std::size_t room = this->out_.try_reserve(this->burst_size())) return read_burst(room);
    const auto ctx = this->context();
    std::optional<T> v = call_with_context(fn_, ctx);
    if (!v) {
      exhausted_.store(true);
      this->end_epoch();
      return Step::done;
    }
    this->count_out();
    this->emit({std::move(v), seq_++});
    return this->out_.blocked() ? Step::blocked : Step::progressed;
  }
  bool has_work() const override { return this->out_.blocked() ? this->out_.can_move() : !exhausted_.load(); }

 private:
  // A burst (see Producer): as many items as there is room for, up to the epoch's end or
  // past the burst's time.
  Step read_burst(std::size_t reserved) {
    {
      typename Producer<T>::Burst burst(*this, reserved);
      const auto ctx = this->context();
      while (burst.room() != 0) {
        std::optional<T> v = call_with_context(fn_, ctx);
        if (!v) {
          exhausted_.store(true);
          break;
        }
        this->count_out();
        if (!burst.add(std::move(*v))) break;
      }
      burst.finish();
    }
    if (!exhausted_.load()) return Step::progressed;
    this->end_epoch();
    return Step::done;
  }

  F fn_;
  std::atomic<bool> exhausted_{false};
  std::uint64_t seq_ = 0;  // touched by one body at a time: the source is serial
};

/// Restores input order at the output of a stage in deterministic mode. Bodies complete
/// inputs in any order; outputs leave in input order and are numbered afresh, which a
/// 1 -> k stage needs. At most `window` inputs may be taken ahead of the oldest one not
/// yet complete, which bounds what waits here.
template <class T>
class Sequencer {
 public:
  explicit Sequencer(std::size_t window) : window_(window) {}
  bool window_full() const { return taken_.load() - released_.load() >= window_; }
  /// Claims a place in the window for an input about to be taken; false when it is full.
  /// Claimed before the pop, not counted after it: two bodies that both saw room must not
  /// both take an input into the last place.
  bool try_claim() {
    auto t = taken_.load();
    while (t - released_.load() < window_)
      if (taken_.compare_exchange_weak(t, t + 1)) return true;
    return false;
  }
  /// Gives back a claim that no input came for.
  void unclaim() { taken_.fetch_sub(1); }

  template <class Emit>
  void complete(std::uint64_t seq, std::vector<T>&& outputs, Emit&& emit) {
    std::lock_guard lock(mutex_);
    waiting_.emplace(seq, std::move(outputs));
    for (auto it = waiting_.begin(); it != waiting_.end() && it->first == next_in_; it = waiting_.erase(it)) {
      for (auto& v : it->second) emit(Envelope<T>{std::move(v), next_out_++});
      ++next_in_;
      released_.fetch_add(1);
    }
  }
  /// Releases `outputs` after everything released so far, then runs `f`, in order with
  /// the releases.
  template <class Emit, class F>
  void after_all(std::vector<T>&& outputs, Emit&& emit, F&& f) {
    std::lock_guard lock(mutex_);
    for (auto& v : outputs) emit(Envelope<T>{std::move(v), next_out_++});
    f();
  }
  void reset() {
    waiting_.clear();
    next_in_ = next_out_ = 0;
    taken_.store(0);
    released_.store(0);
  }

 private:
  const std::size_t window_;
  std::mutex mutex_;
  std::map<std::uint64_t, std::vector<T>> waiting_;
  std::uint64_t next_in_ = 0, next_out_ = 0;
  std::atomic<std::uint64_t> taken_{0}, released_{0};
};

/// Shared by the stages that pop from an edge.
template <class In, class Out>
class Transformer : public Producer<Out> {
 public:
  using Producer<Out>::Producer;
  void connect_input(Edge<In>* edge, StageBase* producer) {
    in_ = edge;
    upstream_ = producer;
  }
  void begin_epoch(std::uint32_t epoch) override {
    Producer<Out>::begin_epoch(epoch);
    arrivals_.reset();
  }

 protected:
  /// Pops an item, or reports `empty` (including after the marker) or `closed`. Wakes the
  /// stage upstream if it waits for room, even when nothing comes out: in deterministic mode a
  /// pop may take items out of the queue only to hold them back for an earlier one, which
  /// the stage upstream may be holding because the queue was full.
  Pop pop(Envelope<In>& e) {
    for (;;) {
      const auto r = in_->try_pop(e);
      if (upstream_) upstream_->wake_if_blocked();
      if (r != Pop::item) return r;
      if (e.value) {
        arrivals_.item();
        return r;
      }
      arrivals_.marker(e.seq);
    }
  }
  /// Appends up to `max` items to `out`, or reports `empty` (including after the marker) or
  /// `closed` when it appends none.
  Pop pop_many(std::vector<Envelope<In>>& out, std::size_t max) {
    const auto had = static_cast<std::ptrdiff_t>(out.size());
    for (;;) {
      const auto r = in_->try_pop_many(out, max);
      if (upstream_) upstream_->wake_if_blocked();  // as in pop()
      if (r != Pop::item) return r;
      const auto markers = std::remove_if(out.begin() + had, out.end(), [&](const Envelope<In>& e) {
        if (!e.value) arrivals_.marker(e.seq);
        return !e.value;
      });
      out.erase(markers, out.end());
      arrivals_.items(out.size() - static_cast<std::size_t>(had));
      if (out.size() != static_cast<std::size_t>(had)) return Pop::item;
    }
  }
  /// How many items the input holds now, roughly.
  std::size_t input_size() const { return in_->meter().size(); }
  /// True once every item of the epoch has been popped.
  bool input_ended() const { return arrivals_.complete(); }
  bool input_ready() const { return in_->ready(); }

 private:
  Edge<In>* in_ = nullptr;
  StageBase* upstream_ = nullptr;
  ArrivalCount arrivals_;
};

/// A flat_map function that holds outputs back until its input ends (a shuffle window):
/// `end_epoch(Emitter<Out>&)`, or with a StageContext last, emits them.
template <class F, class Out>
concept EndsEpoch = requires(F& f, Emitter<Out>& emit, const StageContext& ctx) { f.end_epoch(emit, ctx); } ||
                    requires(F& f, Emitter<Out>& emit) { f.end_epoch(emit); };

/// 1 -> 1 (`map`) or 1 -> k (`flat_map`) on up to `threads` bodies at once.
template <class In, class Out, class F, bool Flat>
class TransformStage final : public Transformer<In, Out> {
  using Step = StageBase::Step;

 public:
  TransformStage(PipelineCore& core, std::string name, int threads, F fn, bool deterministic)
      : Transformer<In, Out>(core, std::move(name), threads), fn_(std::move(fn)) {
    // No body runs more than `threads` inputs ahead of the oldest one not done: outputs that
    // wait for it then hold at most threads - 1 buffers of whatever pool the stage draws from,
    // so a pool of more than that cannot run dry for the very input everyone waits for.
    if (deterministic) sequencer_.emplace(static_cast<std::size_t>(threads));
  }

  void begin_epoch(std::uint32_t epoch) override {
    Transformer<In, Out>::begin_epoch(epoch);
    finished_.store(false);
    if (sequencer_) sequencer_->reset();
  }

 protected:
  Step step() override {
    if (!this->flush()) return Step::blocked;
    if constexpr (!Flat) {
      if (!sequencer_)
        if (const std::size_t room = this->out_.try_reserve(std::min(this->burst_size(), this->input_size())))
          return map_burst(room);
    }
    if (sequencer_ && !sequencer_->try_claim()) return Step::blocked;
    // Counted before the pop, so that whoever sees the last item arrive cannot also see
    // "nothing in process" while this one is on its way.
    in_process_.fetch_add(1);
    Envelope<In> e;
    const auto r = this->pop(e);
    if (r != Pop::item) {
      if (sequencer_) sequencer_->unclaim();
      in_process_.fetch_sub(1);
      maybe_finish();
      return r == Pop::empty ? Step::starved : Step::done;
    }
    if (this->threads() > 1) this->wake();  // a sibling may take the next input
    this->count_in();
    process(std::move(e));
    in_process_.fetch_sub(1);
    maybe_finish();
    return this->out_.blocked() ? Step::blocked : Step::progressed;
  }

  bool has_work() const override {
    if (this->out_.blocked()) return this->out_.can_move();
    return !(sequencer_ && sequencer_->window_full()) && this->input_ready();
  }

 private:
  // A burst (see Producer) of the inputs there are, as far as there is room for them.
  Step map_burst(std::size_t reserved) {
    in_process_.fetch_add(1);  // before the pop: see step()
    typename Producer<Out>::Burst burst(*this, reserved);
    std::vector<Envelope<In>> inputs;
    inputs.reserve(reserved);
    const auto r = this->pop_many(inputs, reserved);
    if (r != Pop::item) {
      burst.finish();
      in_process_.fetch_sub(1);
      maybe_finish();
      return r == Pop::empty ? Step::starved : Step::done;
    }
    if (this->threads() > 1) this->wake();  // a sibling may take the next inputs
    this->count_in(inputs.size());
    const auto ctx = this->context();
    for (auto& e : inputs) burst.add(call_with_context(fn_, ctx, std::move(*e.value)));  // popped: all are made
    this->count_out(inputs.size());
    burst.finish();
    in_process_.fetch_sub(1);
    maybe_finish();
    return Step::progressed;
  }

  void process(Envelope<In>&& e) {
    const auto ctx = this->context();
    if constexpr (!Flat) {
      Out out = call_with_context(fn_, ctx, std::move(*e.value));
      this->count_out();
      if (!sequencer_) return this->emit({std::move(out), 0});
      std::vector<Out> outputs;
      outputs.push_back(std::move(out));
      release(e.seq, std::move(outputs));
    } else {
      // Reused, so that the steady state does not allocate per input.
      thread_local std::vector<Out> outputs;
      outputs.clear();
      Emitter<Out> emit(outputs);
      call_with_context(fn_, ctx, std::move(*e.value), emit);
      this->count_out(outputs.size());
      if (!sequencer_) {
        thread_local std::vector<Envelope<Out>> envelopes;
        envelopes.clear();  // emit_many empties it, unless it threw (bad_alloc) part-way
        for (auto& o : outputs) envelopes.push_back({std::move(o), 0});
        this->emit_many(envelopes);
      } else {
        release(e.seq, std::move(outputs));
      }
    }
  }

  void release(std::uint64_t seq, std::vector<Out>&& outputs) {
    sequencer_->complete(seq, std::move(outputs), [&](Envelope<Out>&& o) { this->emit(std::move(o)); });
    if (this->threads() > 1) this->wake();  // the window may have room again
  }

  // Sends the marker once every item has arrived and been processed. Any body may be
  // the one to see both, so every body asks after each item and after an empty pop.
  void maybe_finish() {
    if (!this->input_ended() || in_process_.load() != 0) return;
    // An end_epoch hook runs once the outputs parked before it have left: what they hold
    // (buffers of a pool the hook draws from) comes back only through the consumer. The body
    // that flushes them pops next, finds the input empty, and asks again.
    if constexpr (Flat && EndsEpoch<F, Out>)
      if (this->out_.blocked()) return;
    if (finished_.exchange(true)) return;
    std::vector<Out> held_back = epoch_end_outputs();
    if (sequencer_) {
      sequencer_->after_all(
          std::move(held_back), [&](Envelope<Out>&& o) { this->emit(std::move(o)); }, [&] { this->end_epoch(); });
    } else {
      for (auto& o : held_back) this->emit({std::move(o), 0});
      this->end_epoch();
    }
  }

  // Only one body gets here, after every call of the function for this epoch has returned.
  std::vector<Out> epoch_end_outputs() {
    std::vector<Out> outputs;
    if constexpr (Flat && EndsEpoch<F, Out>) {
      Emitter<Out> emit(outputs);
      const auto ctx = this->context();
      if constexpr (requires { fn_.end_epoch(emit, ctx); })
        fn_.end_epoch(emit, ctx);
      else
        fn_.end_epoch(emit);
      this->count_out(outputs.size());
    }
    return outputs;
  }

  F fn_;
  std::optional<Sequencer<Out>> sequencer_;
  std::atomic<int> in_process_{0};
  std::atomic<bool> finished_{false};
};

/// Groups `size` items into a std::vector; serial. The last batch of an epoch may be
/// smaller, or dropped.
template <class T>
class BatchStage final : public Transformer<T, std::vector<T>> {
  using Step = StageBase::Step;

 public:
  BatchStage(PipelineCore& core, std::string name, std::size_t size, bool drop_remainder)
      : Transformer<T, std::vector<T>>(core, std::move(name), 1), size_(size), drop_remainder_(drop_remainder) {
    batch_.reserve(size_);
  }

  void begin_epoch(std::uint32_t epoch) override {
    Transformer<T, std::vector<T>>::begin_epoch(epoch);
    batch_.clear();
    batches_ = 0;
    finished_ = false;
  }

 protected:
  // Takes what the batch still lacks in one pop, when that much is there.
  Step step() override {
    if (!this->flush()) return Step::blocked;
    if (finished_) return Step::done;
    inbox_.clear();
    const auto r = this->pop_many(inbox_, size_ - batch_.size());
    if (r == Pop::closed) return Step::done;
    if (r == Pop::item) {
      this->count_in(inbox_.size());
      for (auto& e : inbox_) batch_.push_back(std::move(*e.value));
      if (batch_.size() == size_) send();
    }
    if (this->input_ended()) {
      if (!batch_.empty() && !drop_remainder_) send();
      batch_.clear();
      this->end_epoch();
      finished_ = true;
      return Step::done;
    }
    if (r == Pop::empty) return Step::starved;
    return this->out_.blocked() ? Step::blocked : Step::progressed;
  }
  bool has_work() const override {
    return this->out_.blocked() ? this->out_.can_move() : this->input_ready();
  }

 private:
  void send() {
    this->count_out();
    this->emit({std::move(batch_), batches_++});
    batch_ = std::vector<T>();  // not `= {}`: that assigns an initializer_list, which copies
    batch_.reserve(size_);
  }

  const std::size_t size_;
  const bool drop_remainder_;
  std::vector<T> batch_;
  std::vector<Envelope<T>> inbox_;
  std::uint64_t batches_ = 0;
  bool finished_ = false;  // serial: one body at a time
};

}  // namespace detail
}  // namespace stoker
