// SPDX-License-Identifier: Apache-2.0
// The typed stages: a source, 1 -> 1 and 1 -> k transforms, and a batcher. Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "stoker/core/detail/edges.h"
#include "stoker/core/detail/runtime.h"
#include "stoker/core/stage.h"

namespace stoker::detail {

using Clock = std::chrono::steady_clock;

/// Calls `f(args..., context)` if `f` takes a StageContext last, else `f(args...)`.
template <class F, class... Args>
decltype(auto) call_with_context(F& f, const StageContext& ctx, Args&&... args) {
  if constexpr (std::is_invocable_v<F&, Args..., const StageContext&>)
    return f(std::forward<Args>(args)..., ctx);
  else
    return f(std::forward<Args>(args)...);
}

/// A stage function may cap its stage's chunks with a member `max_chunk()`: 1 for a function
/// that waits for buffers its own outputs would hold (a pool), so that its body holds none.
template <class F>
std::size_t function_max_chunk(const F& f) {
  // Kept as written: clang-format 14 mangles requires-expressions.
  // clang-format off
  if constexpr (requires { { f.max_chunk() } -> std::convertible_to<std::size_t>; })
    return std::max<std::size_t>(f.max_chunk(), 1);
  else
    return std::numeric_limits<std::size_t>::max();
  // clang-format on
}

/// A source function that can start anywhere in an epoch: `seek(index)` (or with a
/// StageContext last) makes its next call yield the epoch's index-th item. Exact resume needs it.
template <class F>
// Kept as written: clang-format 14 mangles requires-expressions.
// clang-format off
concept Seeks = requires(F& f, std::uint64_t i, const StageContext& ctx) { f.seek(i, ctx); } ||
                requires(F& f, std::uint64_t i) { f.seek(i); };
// clang-format on

/// A function that keeps state a resume cannot rebuild says so with a member
/// `static constexpr bool resumable = false`: Pipeline::state() then refuses, naming its stage.
template <class F>
std::string refuses_resume(const std::string& stage) {
  if constexpr (requires { F::resumable; })
    if (!F::resumable) return "stage '" + stage + "' cannot be resumed: its function says so (resumable = false)";
  return {};
}

template <class F>
void seek(F& f, const StageContext& ctx) {
  if constexpr (requires { f.seek(ctx.index, ctx); })
    f.seek(ctx.index, ctx);
  else
    f.seek(ctx.index);
}

/// A stage's output: its queue, and the chunks that cannot go into it yet.
///
/// Every chunk has a key: the position of the first input it was made from, and a piece number
/// for a chunk sent in several pieces. Chunks wait here, in key order, until the queue has room
/// for all of the first; in deterministic mode the first must also be the next in input order,
/// so items leave in the order their inputs came. A stage claims a place before it takes a
/// chunk of inputs and gives it back when the last piece made from them has gone: at most
/// `window` chunks (its threads, as the autotuner sets them) are taken and not gone, which
/// bounds what a stage holds to one chunk per body.
template <class T>
class Output {
 public:
  struct Key {
    std::uint64_t first = 0;
    std::uint32_t piece = 0;
    auto operator<=>(const Key&) const = default;
  };
  static constexpr std::uint32_t kEndPiece = std::numeric_limits<std::uint32_t>::max();

  void connect(Edge<T>* edge, StageBase* downstream) {
    edge_ = edge;
    downstream_ = downstream;
  }
  void start(bool in_order) { in_order_ = in_order; }
  /// Called while no body runs.
  void begin_epoch() {
    next_ = 0;
    claimed_.store(0);
  }

  /// The largest chunk the queue takes (EdgeBase::max_chunk).
  std::size_t cap() const { return edge_->max_chunk(); }
  Edge<T>& edge() const { return *edge_; }
  /// Exact resume, after begin_epoch(): the epoch's chunks start at input `first`.
  void resume_at(std::uint64_t first) { next_ = first; }

  bool try_claim(int window) {
    int c = claimed_.load();
    while (c < window)
      if (claimed_.compare_exchange_weak(c, c + 1)) return true;
    return false;
  }
  void unclaim() { claimed_.fetch_sub(1); }
  bool claimable(int window) const { return claimed_.load() < window; }

  /// Adds the items made from the inputs [key.first, key.first + span): a piece with `span` 0
  /// when more made from the same inputs follow (the last piece carries the span, and its claim
  /// goes back once it is sent). Then sends what may go. True when `items` has been sent.
  bool put(Key key, Chunk<T>&& items, std::uint64_t span) {
    bool sent = false, pushed = false;
    {
      std::lock_guard lock(mutex_);
      waiting_.insert_or_assign(key, Entry{std::move(items), span, false});
      pushed = send_locked();
      sent = !waiting_.contains(key);
    }
    after_send(pushed);
    return sent;
  }
  /// Ends the epoch once everything before it has gone; `inputs` is the number of inputs taken
  /// this epoch (the sum of all spans).
  void put_end(std::uint64_t inputs) {
    bool pushed = false;
    {
      std::lock_guard lock(mutex_);
      waiting_.insert_or_assign(Key{inputs, kEndPiece}, Entry{{}, 0, true});
      pushed = send_locked();
    }
    after_send(pushed);
  }
  /// Sends what may go. True when nothing waits any more.
  bool flush() {
    if (count_.load() == 0) return true;
    bool empty = false, pushed = false;
    {
      std::lock_guard lock(mutex_);
      pushed = send_locked();
      empty = waiting_.empty();
    }
    after_send(pushed);
    return empty;
  }
  /// Whether the chunk of `key` has gone (call flush() first to send what may go).
  bool gone(Key key) {
    std::lock_guard lock(mutex_);
    return !waiting_.contains(key);
  }
  /// True when the chunk that goes next waits for room and the queue has it now.
  bool can_move() const {
    const std::size_t need = need_.load();
    return need != 0 && edge_->room() >= need;
  }

 private:
  struct Entry {
    Chunk<T> items;
    std::uint64_t span = 0;
    bool end = false;
  };

  // Under mutex_: pushes what may go; true when it pushed anything.
  bool send_locked() {
    struct Publish {  // need_ and count_ follow waiting_, also when a push throws
      Output& out;
      std::size_t need = 0;
      ~Publish() {
        out.edge_->note_waiting(static_cast<std::ptrdiff_t>(need) - static_cast<std::ptrdiff_t>(out.need_.load()));
        out.need_.store(need);
        out.count_.store(out.waiting_.size());
      }
    } publish{*this};
    bool pushed = false;
    while (!waiting_.empty()) {
      auto it = waiting_.begin();
      if (in_order_ && it->first.first != next_) break;  // an earlier chunk is not done yet
      Entry& e = it->second;
      if (e.end) {
        edge_->end_epoch();
      } else if (!e.items.empty() && !edge_->try_push(e.items)) {
        publish.need = e.items.size();
        break;
      }
      next_ += e.span;
      if (e.span != 0) claimed_.fetch_sub(1);
      waiting_.erase(it);
      pushed = true;
    }
    return pushed;
  }
  // Outside the lock: the stage downstream has work (the last queue wakes the consumer itself).
  void after_send(bool pushed) {
    if (pushed && downstream_) downstream_->wake();
  }

  Edge<T>* edge_ = nullptr;
  StageBase* downstream_ = nullptr;  // none for the last stage: the consumer pops
  bool in_order_ = false;
  SpinLock mutex_;
  std::map<Key, Entry> waiting_;
  std::uint64_t next_ = 0;  // in order: the first input whose items have not all gone
  std::atomic<int> claimed_{0};
  std::atomic<std::size_t> need_{0}, count_{0};
};

/// A stage that emits T.
template <class T>
class Producer : public StageBase {
 public:
  using StageBase::StageBase;
  void connect_output(Edge<T>* edge, StageBase* downstream) { out_.connect(edge, downstream); }

  void start(PipelineCore& core, std::size_t position) override {
    StageBase::start(core, position);
    out_.start(core.options().deterministic);
  }
  void begin_epoch(std::uint32_t epoch) override {
    StageBase::begin_epoch(epoch);
    out_.begin_epoch();
  }

  std::uint64_t resume(std::uint64_t taken, const PipelineState& state) final {
    const std::uint64_t next =
        out_.edge().resume(taken, state, [this](const std::vector<std::uint64_t>& origins) { return remake(origins); });
    return resume_input(next);
  }
  /// Makes the items of this epoch's output at `origins` (ascending) again, calling the stage's
  /// function and those of the stages before it; while no body runs. For the stages whose
  /// remakes() is true.
  virtual std::vector<T> remake(const std::vector<std::uint64_t>& origins) = 0;

 protected:
  /// Exact resume: the stage's next output has origin `next`, and none below it is to be made;
  /// sets the stage up to go on from there and returns the origin of its next input.
  virtual std::uint64_t resume_input(std::uint64_t next) = 0;

  /// Output::put, and a wake-up for a sibling if the chunk gave its claim back.
  bool put(typename Output<T>::Key key, Chunk<T>&& items, std::uint64_t span) {
    const bool sent = out_.put(key, std::move(items), span);
    if (slots() > 1) wake();
    return sent;
  }
  /// Sends what waits; false when something still does.
  bool flush() {
    const bool clear = out_.flush();
    if (slots() > 1) wake();
    return clear;
  }

  Output<T> out_;
};

/// Takes chunks of inputs from an edge.
template <class In, class Out>
class Consumer : public Producer<Out> {
 public:
  using Producer<Out>::Producer;
  void connect_input(Edge<In>* edge, StageBase* upstream) {
    in_ = edge;
    upstream_ = upstream;
  }

 protected:
  /// Edge::pop, and a wake-up for the stage upstream, which may wait for the room made.
  Pop pop(Chunk<In>& out, std::size_t max, std::uint64_t& first) {
    const Pop r = in_->pop(out, max, first);
    if (r == Pop::items) upstream_->wake();
    return r;
  }
  Edge<In>* in_ = nullptr;
  StageBase* upstream_ = nullptr;
};

/// Calls the user's source until it returns nullopt, which ends the epoch. Serial.
template <class T, class F>
class SourceStage final : public Producer<T> {
  using Step = StageBase::Step;
  using Key = typename Output<T>::Key;

 public:
  SourceStage(std::string name, F fn, std::size_t max_chunk, OnError on_error)
      : Producer<T>(std::move(name), 1, on_error),
        fn_(std::move(fn)),
        max_chunk_(std::min(max_chunk, function_max_chunk(fn_))) {}

  void begin_epoch(std::uint32_t epoch) override {
    Producer<T>::begin_epoch(epoch);
    ended_.store(false);
    calls_ = 0;
  }
  bool has_work() const override {
    return this->out_.can_move() || (!ended_.load() && this->out_.claimable(this->threads()));
  }

  std::string describe() const override { return "source"; }
  std::string fingerprint() const override {
    if constexpr (requires { std::string(fn_.fingerprint()); })
      return std::string(fn_.fingerprint());
    else
      return {};
  }
  std::string resume_problem() const override {
    if (!Seeks<F>)
      return "source '" + this->name() +
             "' cannot be resumed: its function has no member seek(index), which starts it at an epoch's "
             "index-th item";
    return refuses_resume<F>(this->name());
  }
  bool remakes() const override { return resume_problem().empty(); }
  std::vector<T> remake(const std::vector<std::uint64_t>& positions) override {
    std::vector<T> items;
    if constexpr (Seeks<F>) {
      items.reserve(positions.size());
      for (const auto p : positions) {
        const StageContext ctx = this->context_at(p);
        seek(fn_, ctx);
        auto v = call_with_context(fn_, ctx);
        if (!v)
          throw StateError("source '" + this->name() + "' has no item " + std::to_string(p) + " in epoch " +
                           std::to_string(ctx.epoch) + ": is its data what the state was taken with?");
        items.push_back(std::move(*v));
      }
    }
    return items;
  }

 protected:
  std::uint64_t resume_input(std::uint64_t next) override {
    calls_ = next;
    this->out_.resume_at(next);
    if constexpr (Seeks<F>) seek(fn_, this->context_at(next));
    return next;
  }

  Step step(StageBase::Body& body) override {
    this->flush();
    if (ended_.load()) return Step::done;
    if (!this->out_.try_claim(this->threads())) return Step::blocked;
    const std::size_t n = this->chunk_size(std::min(max_chunk_, this->out_.cap()));
    Chunk<T> items;
    items.reserve(n);
    const std::uint64_t first = calls_;
    const auto t0 = Clock::now();
    const auto tick = coarse_ticks();
    const auto blocked0 = body.blocked;
    bool ended = false;
    while (calls_ - first < n && !this->stopping()) {
      body.ctx.index = calls_++;
      std::optional<T> v;
      // Made in place: an item type need not be assignable (a const member).
      const auto call = [&] {
        if (auto made = call_with_context(fn_, body.ctx)) v.emplace(std::move(*made));
      };
      if (!this->guarded(body.ctx.index, call)) continue;
      if (!v) {
        ended = true;
        break;
      }
      items.push(std::move(*v), body.ctx.index);
      if (coarse_ticks() != tick && Clock::now() - t0 > this->kChunkTime) break;  // slow: hand on what is made
    }
    this->measured(calls_ - first,
                   std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0) - (body.blocked - blocked0));
    this->count_out(items.size());
    this->put(Key{first, 0}, std::move(items), calls_ - first);
    if (!ended) return Step::progressed;
    ended_.store(true);
    this->out_.put_end(calls_);
    return Step::done;
  }

 private:
  F fn_;
  const std::size_t max_chunk_;
  std::atomic<bool> ended_{false};
  std::uint64_t calls_ = 0;  // this epoch; one body at a time
};

/// A flat_map function that holds outputs back until its input ends (a shuffle window):
/// `end_epoch(Emitter<Out>&)`, or with a StageContext last, emits them.
template <class F, class Out>
// Kept as written: clang-format 14 mangles requires-expressions.
// clang-format off
concept EndsEpoch = requires(F& f, Emitter<Out>& emit, const StageContext& ctx) { f.end_epoch(emit, ctx); } ||
                    requires(F& f, Emitter<Out>& emit) { f.end_epoch(emit); };
// clang-format on

/// 1 -> 1 (`map`) or 1 -> k (`flat_map`) on up to `threads` bodies at once.
template <class In, class Out, class F, bool Flat>
class TransformStage final : public Consumer<In, Out> {
  using Step = StageBase::Step;
  using Key = typename Output<Out>::Key;

 public:
  struct Options {
    int threads = 1;
    std::size_t max_chunk = std::numeric_limits<std::size_t>::max();
    OnError on_error = OnError::fail;
    bool copy_per_body = false;
    bool tunable = true;
    std::size_t fanout = 0;
  };

  TransformStage(std::string name, F fn, Options o)
      : Consumer<In, Out>(std::move(name), o.threads, o.on_error),
        max_chunk_(std::min(o.max_chunk, function_max_chunk(fn))),
        copy_per_body_(o.copy_per_body),
        tunable_(o.tunable),
        fanout_(Flat ? o.fanout : 1),
        fns_(only(std::move(fn))) {
    if (copy_per_body_ && !std::is_copy_constructible_v<F>)
      throw std::invalid_argument("stage '" + this->name() +
                                  "': copy_per_body needs a function that can be copied, one copy per body");
  }

  std::string describe() const override {
    if (!Flat) return "map";
    return fanout_ != 0 ? "flat_map fanout " + std::to_string(fanout_) : "flat_map";
  }
  std::string resume_problem() const override {
    if (EndsEpoch<F, Out>)
      return "flat_map '" + this->name() +
             "' cannot be resumed: its function holds outputs back until the end of the epoch (end_epoch), "
             "which a resume cannot make again";
    if (fanout_ == 0)
      return "flat_map '" + this->name() +
             "' cannot be resumed: give it StageOptions::fanout, the number of outputs of every input, so that "
             "a resume knows which input an output came from";
    return refuses_resume<F>(this->name());
  }
  bool remakes() const override { return resume_problem().empty(); }
  // The inputs of the outputs at `positions`, made again by the stages before, and this stage's
  // function called on each with the context it had.
  std::vector<Out> remake(const std::vector<std::uint64_t>& positions) override {
    std::vector<std::uint64_t> inputs;
    for (const auto p : positions)
      if (inputs.empty() || inputs.back() != p / fanout_) inputs.push_back(p / fanout_);
    auto made_inputs = static_cast<Producer<In>*>(this->upstream_)->remake(inputs);
    std::vector<Out> items;
    items.reserve(positions.size());
    auto wanted = positions.begin();
    std::vector<Out> outputs;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const StageContext ctx = this->context_at(inputs[i]);
      outputs.clear();
      if constexpr (Flat) {
        Emitter<Out> emit(outputs);
        call_with_context(fns_.front(), ctx, std::move(made_inputs[i]), emit);
        check_fanout(outputs.size(), ctx.index);
      } else {
        outputs.push_back(call_with_context(fns_.front(), ctx, std::move(made_inputs[i])));
      }
      for (; wanted != positions.end() && *wanted / fanout_ == inputs[i]; ++wanted)
        items.push_back(std::move(outputs[*wanted % fanout_]));
    }
    return items;
  }

  bool tunable() const override { return tunable_; }
  void start(PipelineCore& core, std::size_t position) override {
    Consumer<In, Out>::start(core, position);
    const auto slots = static_cast<std::size_t>(this->slots());
    inputs_.resize(slots);
    if (copy_per_body_) {
      if constexpr (std::is_copy_constructible_v<F>) {
        fns_.reserve(slots);  // copies of the first, made before any body calls one
        while (fns_.size() < slots) fns_.push_back(fns_.front());
      }
    }
  }
  void begin_epoch(std::uint32_t epoch) override {
    Consumer<In, Out>::begin_epoch(epoch);
    finished_.store(false);
  }
  bool has_work() const override {
    if (this->out_.can_move()) return true;
    if (!this->out_.claimable(this->threads())) return false;
    if (this->in_->drained()) return !finished_.load() && processing_.load() == 0;
    return this->in_->ready() && !this->in_->drained();
  }

 protected:
  std::uint64_t resume_input(std::uint64_t next) override {
    const std::uint64_t per_input = std::max<std::uint64_t>(fanout_, 1);  // 0: refused before
    this->out_.edge().skip_made(next, per_input);
    this->out_.resume_at(next / per_input);
    return next / per_input;
  }

  Step step(StageBase::Body& body) override {
    this->flush();
    if (!this->out_.try_claim(this->threads())) return Step::blocked;
    // Counted before the pop, so that whoever sees the input drained also sees this chunk in
    // process (maybe_finish()).
    processing_.fetch_add(1);
    auto& inputs = inputs_[static_cast<std::size_t>(body.ctx.body)];
    inputs.clear();
    std::uint64_t first = 0;
    const Pop r = this->pop(inputs, inputs_per_chunk(), first);
    if (r != Pop::items) {
      this->out_.unclaim();
      processing_.fetch_sub(1);
      maybe_finish(body);
      return r == Pop::empty ? Step::starved : Step::done;
    }
    if (this->slots() > 1) this->wake();  // a sibling may take the next chunk
    this->count_in(inputs.size());
    process(body, inputs, first);
    processing_.fetch_sub(1);
    maybe_finish(body);
    return Step::progressed;
  }

 private:
  // kChunkTime of work, as many outputs as the queue takes at once, and, with several bodies,
  // no more than a fair share of what is queued: uneven items must not starve the siblings.
  std::size_t inputs_per_chunk() const {
    const std::size_t per_output =
        Flat ? std::max<std::size_t>(1, mean_fanout_.load(std::memory_order_relaxed) / 16) : 1;
    std::size_t n = this->chunk_size(std::min(max_chunk_, std::max<std::size_t>(1, this->out_.cap() / per_output)));
    if (this->threads() > 1) {
      const std::size_t queued = this->in_->capacity() - std::min(this->in_->room(), this->in_->capacity());
      n = std::min(
          n, std::max<std::size_t>(1, (queued + this->threads() - 1) / static_cast<std::size_t>(this->threads())));
    }
    return n;
  }

  F& fn(const StageBase::Body& body) {
    return fns_.size() == 1 ? fns_[0] : fns_[static_cast<std::size_t>(body.ctx.body)];
  }

  // A body's outputs on their way out: the chunk being made, and the pieces sent from it.
  //
  // Invariant: a call's outputs stay in `outputs` until the call returns, unless the call alone
  // fills a chunk (`limit` outputs). The emit that fills a chunk sends what earlier calls made
  // as a piece and keeps the call's own; only when the call's own fill it do they go as a piece,
  // and the emit waits until that piece has gone (Emitter), so that a body holds at most one
  // piece on its way and one being made. So when a call fails, drop_call() can take out every
  // output it made, and OnError::skip drops the call whole, unless the call had sent a piece of
  // its own: that cannot be taken back, and the run fails instead. With a fanout, the emit past
  // it throws (the item's error) before the call can fill a chunk of its own, when the fanout is
  // below the limit.
  class Spill {
   public:
    Spill(TransformStage& stage, StageBase::Body& body, Chunk<Out>& outputs, Key key, std::size_t limit,
          std::size_t fanout, bool numbered)
        : stage_(stage),
          body_(body),
          outputs_(outputs),
          key_(key),
          limit_(limit),
          fanout_(fanout),
          numbered_(numbered),
          emit_(EmitterAccess<Out>::make(outputs.items, limit, &Spill::full, this)) {}
    Spill(const Spill&) = delete;  // the emitter points here
    Spill& operator=(const Spill&) = delete;

    Emitter<Out>& emitter() { return emit_; }
    Key key() const { return key_; }
    std::size_t spilled() const { return spilled_; }

    // A call for the input of origin `origin` starts.
    void begin_call(std::uint64_t origin) {
      input_ = origin;
      made_ = 0;
      call_begin_ = outputs_.size();
      call_sent_ = 0;
      set_limit();
    }
    // The call returned: its outputs, counted against the fanout, join the chunk.
    void end_call() {
      stage_.check_fanout(call_sent_ + outputs_.size() - call_begin_, input_);
      number();
    }
    // The call failed: takes out what it left in `outputs`. False when it sent some on, which
    // cannot be taken back.
    bool drop_call() {
      while (outputs_.size() > call_begin_) outputs_.items.pop_back();
      return call_sent_ == 0;
    }
    std::size_t call_sent() const { return call_sent_; }

    // Sends what is made so far, and returns once it has gone (`wait`) or at once; a piece
    // that has not gone yet makes a send without `wait` a no-op, so that a body holds at most
    // one piece on its way and one being made.
    void send(bool wait) {
      try {
        if (!wait && key_.piece != 0 && !gone(Key{key_.first, key_.piece - 1})) return;
        number();
        const Key k = key_;
        ++key_.piece;
        spilled_ += outputs_.size();
        const std::size_t capacity = outputs_.items.capacity();
        const bool sent = stage_.put(k, std::move(outputs_), 0);
        outputs_.clear();
        outputs_.reserve(capacity);
        in_chunk_ = 0;
        if (sent || !wait) return;
        BlockedTime waiting(body_.ctx);
        stage_.core().wait_for(stage_, [&] { return gone(k); });
      } catch (const PipelineStopped&) {
        throw;
      } catch (...) {  // inside the function's call, but not the item's fault
        throw RuntimeFailure{std::current_exception()};
      }
    }

   private:
    // Origins for a flat_map's outputs emitted since the last numbering: the j-th output of
    // input o is o * fanout + j. A flat_map without a fanout cannot number them, nor can
    // end_epoch(): the queue numbers them (Chunk). A map's outputs are numbered as they are made.
    void number() {
      if (!Flat || !numbered_) return;
      for (; in_chunk_ < outputs_.size(); ++in_chunk_) outputs_.number(input_ * fanout_ + made_++);
    }
    // The emit that fills a chunk, or that goes past the fanout, lands here.
    static void full(void* self) { static_cast<Spill*>(self)->filled(); }
    void filled() {
      const std::size_t own = outputs_.size() - call_begin_;
      if (fanout_ != 0 && call_sent_ + own > fanout_) stage_.check_fanout(call_sent_ + own, input_);  // throws
      if (call_begin_ == 0) {  // the call's own fill the chunk: they go
        call_sent_ += own;
        send(true);
      } else {
        send_earlier_calls();
      }
      set_limit();
    }
    // Sends, as a piece, the outputs of the calls before this one (numbered when they
    // returned), and keeps this call's, moved to a fresh chunk.
    void send_earlier_calls() {
      try {
        std::vector<Out> own;
        own.reserve(outputs_.items.capacity());
        for (std::size_t i = call_begin_; i < outputs_.size(); ++i) own.push_back(std::move(outputs_.items[i]));
        while (outputs_.size() > call_begin_) outputs_.items.pop_back();
        call_begin_ = 0;
        send(true);  // sends the earlier calls' outputs: `number()` has nothing new to number
        outputs_.items = std::move(own);
      } catch (const PipelineStopped&) {
        throw;
      } catch (const RuntimeFailure&) {
        throw;
      } catch (...) {
        throw RuntimeFailure{std::current_exception()};
      }
    }
    // The emit that fills a chunk, or the one past the fanout, calls full().
    void set_limit() {
      std::size_t limit = limit_;
      if (fanout_ != 0) limit = std::min(limit, call_begin_ + fanout_ - call_sent_ + 1);
      EmitterAccess<Out>::set_limit(emit_, limit);
    }
    bool gone(Key k) {
      stage_.flush();  // what has room goes, and siblings learn of claims given back
      return stage_.out_.gone(k);
    }

    TransformStage& stage_;
    StageBase::Body& body_;
    Chunk<Out>& outputs_;  // the emitter appends to its items; number() gives them their origins
    Key key_;
    const std::size_t limit_;
    const std::size_t fanout_;  // 0: any number of outputs per call
    const bool numbered_;       // false: the queue numbers the outputs (Chunk)
    Emitter<Out> emit_;
    std::size_t spilled_ = 0;     // items sent so far
    std::size_t in_chunk_ = 0;    // items of `outputs` numbered
    std::uint64_t input_ = 0;     // the origin of the input whose call emits now
    std::uint64_t made_ = 0;      // its outputs numbered so far
    std::size_t call_begin_ = 0;  // where its outputs start in `outputs`
    std::size_t call_sent_ = 0;   // its outputs sent on in pieces
  };

  void process(StageBase::Body& body, Chunk<In>& inputs, std::uint64_t first) {
    Chunk<Out> outputs;
    const std::size_t limit = std::min(max_chunk_, this->out_.cap());
    // Never grown while a call emits: a growth would move the items already emitted, in the
    // function's call but not its doing (see Spill).
    outputs.reserve(Flat ? limit : inputs.size());
    Spill spill(*this, body, outputs, Key{first, 0}, limit, fanout_, fanout_ != 0);
    const auto t0 = Clock::now();
    const auto tick = coarse_ticks();
    const auto blocked0 = body.blocked;
    std::size_t i = 0;
    for (const Origins& run : inputs.runs)
      for (std::uint64_t k = 0; k < run.count && !this->stopping(); ++k, ++i) {
        body.ctx.index = run.first + k;
        this->guarded(body.ctx.index, [&] {
          if constexpr (Flat) {
            spill.begin_call(body.ctx.index);
            try {
              call_with_context(fn(body), body.ctx, std::move(inputs.items[i]), spill.emitter());
              spill.end_call();
            } catch (const PipelineStopped&) {
              throw;
            } catch (const RuntimeFailure&) {
              throw;
            } catch (...) {
              if (!spill.drop_call() && this->skips()) throw_sent_on(body.ctx, spill.call_sent(), limit);
              throw;
            }
          } else {
            outputs.push(call_with_context(fn(body), body.ctx, std::move(inputs.items[i])), body.ctx.index);
          }
        });
        // Slower than usual: hand on what is made rather than keep it from the stages downstream.
        if (i + 1 < inputs.size() && !outputs.empty() && coarse_ticks() != tick && Clock::now() - t0 > this->kChunkTime)
          spill.send(false);
      }
    this->measured(inputs.size(),
                   std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0) - (body.blocked - blocked0));
    const std::size_t made = spill.spilled() + outputs.size();
    if constexpr (Flat)
      mean_fanout_.store((mean_fanout_.load(std::memory_order_relaxed) + 16 * made / inputs.size()) / 2,
                         std::memory_order_relaxed);
    this->count_out(made);
    this->put(spill.key(), std::move(outputs), inputs.size());
  }

  // In a catch block, under OnError::skip: a call that failed after `sent` of its outputs had
  // gone on cannot be skipped, and the pipeline fails with an error that says why, the call's
  // own nested in it.
  [[noreturn]] void throw_sent_on(const StageContext& ctx, std::size_t sent, std::size_t limit) const {
    std::string what = "unknown exception";
    try {
      throw;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    try {
      std::throw_with_nested(std::runtime_error(
          "input " + std::to_string(ctx.index) + " of epoch " + std::to_string(ctx.epoch) + " failed after " +
          std::to_string(sent) + " of its outputs had gone on, which on_error = skip cannot take back (a call's " +
          "outputs stay in the stage until it returns only while they fit in a chunk, " + std::to_string(limit) +
          " here): " + what));
    } catch (...) {
      throw RuntimeFailure{std::current_exception()};
    }
  }

  // Sends the end of the epoch once every input has been taken and processed. Any body may be
  // the one to see both, so every body asks after each chunk and after a pop that found none.
  // The input first, then processing_, all sequentially consistent: a body counts itself in
  // processing_ before its pop, so a pop that took the last inputs comes before the read that
  // sees the input drained, and its count before the read of processing_ that follows. Read the
  // other way round, a sibling could count itself and take the last inputs between the two
  // reads, and its chunk would reach the queue after the epoch's end.
  void maybe_finish(StageBase::Body& body) {
    if (!this->in_->drained() || processing_.load() != 0 || finished_.exchange(true)) return;
    const std::uint64_t inputs = this->in_->taken();
    if constexpr (Flat && EndsEpoch<F, Out>) {
      // Every call of the function for this epoch has returned.
      Chunk<Out> outputs;
      const std::size_t limit = std::min(max_chunk_, this->out_.cap());
      outputs.reserve(limit);  // see process()
      Spill spill(*this, body, outputs, Key{inputs, 0}, limit, /*fanout=*/0, /*numbered=*/false);
      auto& emit = spill.emitter();
      for (auto& f : fns_) {
        if constexpr (requires { f.end_epoch(emit, body.ctx); })
          f.end_epoch(emit, body.ctx);
        else
          f.end_epoch(emit);
      }
      if (!outputs.empty()) spill.send(true);
      this->count_out(spill.spilled());
    }
    this->out_.put_end(inputs);
  }

  // An input's outputs must number fanout_, when given: the item's error otherwise.
  void check_fanout(std::size_t made, std::uint64_t index) const {
    if (fanout_ != 0 && made != fanout_) throw_fanout(index, made, fanout_);
  }

  const std::size_t max_chunk_;
  const bool copy_per_body_, tunable_;
  const std::size_t fanout_;                  // outputs per input; 0: any number
  // A vector of one, made without a copy: the function may be move-only.
  static std::vector<F> only(F&& fn) {
    std::vector<F> v;
    v.push_back(std::move(fn));
    return v;
  }
  std::vector<F> fns_;                        // one, or one per body
  std::vector<Chunk<In>> inputs_;             // per body slot
  std::atomic<std::size_t> mean_fanout_{16};  // outputs per input, times 16, averaged over chunks
  std::atomic<int> processing_{0};            // chunks taken and not yet put
  std::atomic<bool> finished_{false};
};

/// Groups `size` items into a std::vector; serial. The last batch of an epoch may be smaller,
/// or dropped.
template <class T>
class BatchStage final : public Consumer<T, std::vector<T>> {
  using Step = StageBase::Step;
  using Key = typename Output<std::vector<T>>::Key;

 public:
  BatchStage(std::string name, std::size_t size, bool drop_remainder)
      : Consumer<T, std::vector<T>>(std::move(name), 1, OnError::fail), size_(size), drop_remainder_(drop_remainder) {
    batch_.reserve(size_);
  }
  bool batches() const override { return true; }

  void begin_epoch(std::uint32_t epoch) override {
    Consumer<T, std::vector<T>>::begin_epoch(epoch);
    batch_.clear();
    batches_ = 0;
    finished_.store(false);
  }
  bool has_work() const override {
    if (this->out_.can_move()) return true;
    if (!this->out_.claimable(this->threads()) || finished_.load()) return false;
    return this->in_->ready();
  }

  std::string describe() const override {
    return "batch " + std::to_string(size_) + (drop_remainder_ ? " drop_remainder" : "");
  }
  bool remakes() const override { return false; }
  std::vector<std::vector<T>> remake(const std::vector<std::uint64_t>&) override {
    throw std::logic_error("batch '" + this->name() + "' cannot make its batches again");
  }

 protected:
  std::uint64_t resume_input(std::uint64_t next) override {
    batches_ = next;
    this->out_.resume_at(next);
    return next * size_;
  }

  // Takes what the batch still lacks in one pop, when that much is there.
  Step step(StageBase::Body&) override {
    if (!this->flush()) return Step::blocked;
    if (finished_.load()) return Step::done;
    std::uint64_t first = 0;
    const std::size_t had = batch_.size();
    const Pop r = this->pop(batch_, size_ - batch_.size(), first);
    if (r == Pop::closed) return Step::done;
    this->count_in(batch_.size() - had);
    if (batch_.size() == size_) send();
    if (r == Pop::ended) {
      if (!batch_.empty() && !drop_remainder_) send();
      batch_.clear();
      this->out_.put_end(batches_);
      finished_.store(true);
      return Step::done;
    }
    return r == Pop::empty ? Step::starved : Step::progressed;
  }

 private:
  void send() {
    this->out_.try_claim(this->threads());  // serial, and flushed before: never refused
    Chunk<std::vector<T>> one;
    one.push(std::move(batch_.items), batches_);
    if (auto* taken = this->core().taken_items()) detail::batched(*taken, batches_, batch_.origin_list());
    this->count_out(1);
    this->put(Key{batches_, 0}, std::move(one), 1);
    ++batches_;
    batch_ = Chunk<T>();
    batch_.reserve(size_);
  }

  const std::size_t size_;
  const bool drop_remainder_;
  Chunk<T> batch_;
  std::uint64_t batches_ = 0;  // one body at a time
  std::atomic<bool> finished_{false};
};

}  // namespace stoker::detail
