// SPDX-License-Identifier: Apache-2.0
// What a stage function sees of the pipeline that calls it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <stop_token>
#include <utility>
#include <vector>

namespace stoker {

/// What a stage does with an item whose function throws (StageOptions::on_error).
enum class OnError : std::uint8_t {
  fail,  ///< stop the pipeline; the consumer gets a StageError naming the stage
  /// Drop the item, count it in the stage's `skipped`, log the first few, go on. A skipped
  /// flat_map call's outputs are all dropped, also those it emitted before it threw: they stay
  /// in the stage until the call returns. Only a call that alone emits more than a chunk (the
  /// queue after it takes half its capacity at once, or max_chunk) has sent its first chunks
  /// on before it returns; if it throws after that, they cannot be taken back, and the
  /// pipeline fails with a StageError that says so.
  skip,
};

/// What a stage function may ask about the call it is in. A function that takes
/// `const StageContext&` as its last parameter gets one; it is valid for the call. To call a
/// stage function outside a pipeline, make one: `StageContext{.seed = 7, .epoch = 2}`.
///
/// What ties a context to its pipeline (in_pipeline(), help_downstream(), BlockedTime) holds on
/// the thread the pipeline called the function on, while the call runs: elsewhere (on a thread
/// the function hands work to, or in a copy kept for later) a context acts as one made outside
/// a pipeline. The fields hold anywhere.
struct StageContext {
  std::uint64_t seed = 0;   ///< the pipeline's seed
  std::uint32_t epoch = 0;  ///< the epoch the item belongs to
  /// Which item of the epoch this is, from 0, as the stages before numbered it: for a source,
  /// the number of calls before this one; a map keeps its input's index, a flat_map with a
  /// fanout k gives the j-th output of input i the index i * k + j, a shuffle keeps it, and a
  /// batch is numbered in the order the batch stage makes it. Distinct for every item of an
  /// epoch, and the same item has the same index on every run, in free order too. (Outputs of
  /// a flat_map without a fanout are numbered as they reach the next queue.)
  std::uint64_t index = 0;
  /// Which of the stage's bodies makes the call, from 0 to threads - 1 (under the autotuner, to
  /// its budget - 1). No two calls running at the same time have the same, so it can index
  /// per-body scratch space.
  int body = 0;
  /// Requested once the pipeline stops (stop(), an error in any stage, destruction). A function
  /// that waits for something outside the pipeline, such as a free buffer of a pool, must also
  /// wake for this and give up by throwing PipelineStopped. Usable from any thread; asking has
  /// no side effects.
  std::stop_token stop{};

  /// Runs, on the calling thread, one body of a later stage that has work, if any: true when it
  /// did. A function that waits for something a later stage or the consumer gives back (a free
  /// buffer of a pool) calls it while it waits, between checks of what it waits for: waiting
  /// bodies then never hold every thread of the pipeline while the stage that would give back
  /// needs one. False outside a pipeline, or when no later stage can run now.
  bool help_downstream() const;
  /// Whether this is the context of a pipeline's call running on this thread (false for a
  /// context made outside one): only then can help_downstream() run anything.
  bool in_pipeline() const noexcept;
};

namespace detail {
/// Where BlockedTime adds up: the counter of the body whose call on this thread has `ctx` as its
/// context; null for any other context.
std::chrono::nanoseconds* blocked_time_of(const StageContext& ctx) noexcept;
/// The running call's body gives back its turn of the pipeline's ThreadBudget (true if it held
/// one), and takes one again (which may wait).
bool give_turn() noexcept;
void take_turn() noexcept;
/// Gives the call's turn of its pipeline's ThreadBudget back for its scope, and takes one again
/// at its end (which may wait), counting nothing: for a wait that is the call's own work, such as
/// a network receive, which BlockedTime would count as blocked. Nothing for a context that is not
/// a pipeline's call on this thread. As with BlockedTime, never let it end under a lock another
/// body may need.
class TurnReleased {
 public:
  explicit TurnReleased(const StageContext& ctx) noexcept : gave_(ctx.in_pipeline() && give_turn()) {}
  ~TurnReleased() {
    if (gave_) take_turn();
  }
  TurnReleased(const TurnReleased&) = delete;
  TurnReleased& operator=(const TurnReleased&) = delete;

 private:
  bool gave_;
};
}  // namespace detail

/// Thrown by a stage function that gave up waiting because its pipeline is stopping; the
/// pipeline does not report it as an error.
struct PipelineStopped : std::runtime_error {
  PipelineStopped() : std::runtime_error("the pipeline is stopping") {}
};

/// Counts the time from its construction to its destruction as the calling stage's blocked
/// time rather than busy time: for a function that waits for something given back downstream,
/// such as a free buffer of a pool. Under a ThreadBudget the call gives back its turn while it
/// waits, and takes one again at the end (counted as blocked too): so its end may wait for
/// another body, and must never come while the call holds a lock another body may need (declare
/// the BlockedTime before the lock). If the pipeline stops meanwhile, the call goes on without a
/// turn until it returns. Does nothing for a context that is not a pipeline's call on this thread.
class BlockedTime {
 public:
  explicit BlockedTime(const StageContext& ctx) noexcept
      : into_(detail::blocked_time_of(ctx)), gave_(into_ != nullptr && detail::give_turn()), since_(Clock::now()) {}
  ~BlockedTime() {
    if (gave_) detail::take_turn();
    if (into_) *into_ += Clock::now() - since_;
  }
  BlockedTime(const BlockedTime&) = delete;
  BlockedTime& operator=(const BlockedTime&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  std::chrono::nanoseconds* into_;
  bool gave_;
  Clock::time_point since_;
};

namespace detail {
template <class T>
class EmitterAccess;
}

/// What a flat_map function emits its outputs through: `emit(value)`, any number of times.
///
/// In a pipeline, outputs go downstream in chunks. A call's outputs stay in its stage until it
/// returns, unless the call alone emits more than a chunk: then the emit that completes a chunk
/// sends it on and waits until the queue downstream has taken it, so a stage that emits without
/// bound (one file into many records) is bounded too. With a fanout (StageOptions::fanout), the
/// emit past it throws, as the item's error.
///
/// An Emitter belongs to the call it is given to: use it on that call's thread, while the call
/// runs. It is not thread-safe (outputs made on other threads are emitted from the call's thread
/// once they are back), and it must not be kept past the call's return.
template <class T>
class Emitter {
 public:
  /// Collects every output into `out`: for calling a flat_map function outside a pipeline.
  explicit Emitter(std::vector<T>& out) noexcept : out_(&out) {}

  void operator()(T value) {
    out_->push_back(std::move(value));
    if (out_->size() >= limit_) full_(owner_);  // empties *out_
  }

 private:
  friend class detail::EmitterAccess<T>;
  Emitter(std::vector<T>& out, std::size_t limit, void (*full)(void*), void* owner) noexcept
      : out_(&out), limit_(limit), full_(full), owner_(owner) {}

  std::vector<T>* out_;
  std::size_t limit_ = std::numeric_limits<std::size_t>::max();
  void (*full_)(void*) = nullptr;
  void* owner_ = nullptr;
};

namespace detail {
template <class T>
class EmitterAccess {
 public:
  static Emitter<T> make(std::vector<T>& out, std::size_t limit, void (*full)(void*), void* owner) noexcept {
    return Emitter<T>(out, limit, full, owner);
  }
  /// The emit that makes `out` this long calls `full`.
  static void set_limit(Emitter<T>& emit, std::size_t limit) noexcept { emit.limit_ = limit; }
};
}  // namespace detail

}  // namespace stoker
