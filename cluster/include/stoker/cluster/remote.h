// SPDX-License-Identifier: Apache-2.0
// Remote preprocessing workers: a pipeline cut at one edge, the stages before it on worker
// ranks and those after it on a trainer rank, the edge carrying items between them over MPI,
// with the capacity bound and exactly-once epochs of a queue inside one process.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "stoker/cluster/communicator.h"
#include "stoker/cluster/elastic.h"
#include "stoker/core/pipeline.h"
#include "stoker/core/stage.h"
#include "stoker/core/stage_error.h"
#include "stoker/stages/reader.h"
#include "stoker/stages/shard.h"

namespace stoker::cluster {

/// Where a trainer's training stands, for a checkpoint and a resume: its epoch, and the units
/// of that epoch (cluster/elastic.h: `fanout` of each of the data set's `samples`, named by the
/// sample's position in the epoch's order) that it has not trained.
struct RemoteProgress {
  std::uint32_t epoch = 0;
  std::uint64_t samples = 0, fanout = 1;
  UnitRanges left;
  bool operator==(const RemoteProgress&) const = default;
};

struct RemoteOptions {
  std::string name = "remote";  ///< the edge's name, in its errors
  int trainer = 0;              ///< the rank whose pipeline receives the items
  std::vector<int> workers{};   ///< the ranks whose pipelines send them; empty: every rank but the trainer
  /// Items sent by the workers and not yet taken by the trainer's pipeline, at most: each worker
  /// holds a share of this many credits and sends an item only for one. At least one per worker.
  std::size_t capacity = 8;
  std::uint64_t shard = 256;  ///< samples per shard handed to a worker that asks for work
  /// How long a worker may hold work and a credit to send it with, and send nothing, before
  /// the trainer gives its work to another worker and drops whatever it sends later; and half
  /// the time a worker that waits for the trainer (a start, a shard, a credit, the stop) hears
  /// nothing from it before it gives the trainer up and the job ends, naming the trainer: one
  /// deadline, however many waits it spans. Zero: as long as it takes.
  std::chrono::milliseconds lease{std::chrono::minutes(5)};
  /// Trainer: go on from a checkpoint's progress (RemoteEdge::progress()) rather than from the
  /// first epoch's start: the workers make exactly its units left, then the epochs after it.
  std::optional<RemoteProgress> resume{};
};

enum class RemoteRole {
  trainer,  ///< receives: RemoteEdge::receiver()
  worker,   ///< sends: RemoteEdge::shards(), RemoteEdge::serve()
  none,     ///< a rank the edge does not involve
};

/// What went through the edge so far, as this rank saw it.
struct RemoteStats {
  std::uint64_t items = 0;  ///< trainer: items received; worker: items sent
  std::uint64_t bytes = 0;  ///< their encoded size
  /// Trainer: the most items received and not yet taken by its pipeline at once (at most the
  /// capacity). Worker: the most items sent and not yet taken at once (at most its share).
  std::size_t peak_in_flight = 0;
  std::uint64_t shards = 0;                   ///< trainer: shards handed out; worker: shards received
  std::vector<std::uint64_t> worker_samples;  ///< trainer: samples handed to each worker, in `workers` order
  /// Trainer: the workers whose lease ran out (their work went to others), in the order they
  /// were lost.
  std::vector<int> lost;
  /// Trainer: the times a worker was given another's work (or at a resume, work partly done):
  /// each restarted that worker's pipeline. Worker: the pipelines it built.
  std::uint64_t restarts = 0;
};

/// A worker's failure, as the trainer receives it: the worker's rank, and its failed stage
/// (empty when the error came from outside the worker's pipeline).
class RemoteError : public ClusterError {
 public:
  RemoteError(int rank, std::string stage, const std::string& message)
      : ClusterError(message), rank_(rank), stage_(std::move(stage)) {}
  int rank() const noexcept { return rank_; }
  const std::string& stage() const noexcept { return stage_; }

 private:
  int rank_;
  std::string stage_;
};

/// One item's bytes on the wire: what Codec<T>::encode makes and Codec<T>::decode reads.
///
/// Not zero-filled when made, and taken from a process-wide cache of freed blocks, to which it
/// goes back when destroyed: an edge moves blocks of the same few sizes over and over, and
/// memory fresh from the system costs a page fault per 4 KiB on first touch, which for a
/// 600 KiB batch costs more than MPI's copy of it. The cache keeps at most 64 blocks and
/// 256 MiB; a block is reused for a request of between half its size and its size. Thread-safe.
class Bytes {
 public:
  Bytes() = default;
  explicit Bytes(std::size_t n);
  ~Bytes();
  Bytes(Bytes&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        capacity_(std::exchange(o.capacity_, 0)) {}
  Bytes& operator=(Bytes&& o) noexcept {
    Bytes gone(std::move(*this));
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    return *this;
  }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;

  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
};

/// How an item of type T crosses the edge: `static Bytes encode(T&&)` and
/// `static T decode(Bytes&&)`, which throws for bytes that are not an item. Given for Bytes
/// (moved, no copy), trivially copyable types, std::vector of them and std::string (one copy
/// each way); specialize it for your own types.
template <class T>
struct Codec;

template <>
struct Codec<Bytes> {
  static Bytes encode(Bytes&& b) { return std::move(b); }
  static Bytes decode(Bytes&& b) { return std::move(b); }
};

template <class T>
requires std::is_trivially_copyable_v<T>
struct Codec<T> {
  static Bytes encode(T&& v) {
    Bytes b(sizeof(T));
    std::memcpy(b.data(), &v, sizeof(T));
    return b;
  }
  static T decode(Bytes&& b) {
    if (b.size() != sizeof(T))
      throw ClusterError("an item of " + std::to_string(b.size()) + " bytes arrived where one of " +
                         std::to_string(sizeof(T)) + " was expected");
    T v;
    std::memcpy(&v, b.data(), sizeof(T));
    return v;
  }
};

template <class U>
requires std::is_trivially_copyable_v<U>
struct Codec<std::vector<U>> {
  static Bytes encode(std::vector<U>&& v) {
    Bytes b(v.size() * sizeof(U));
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
  }
  static std::vector<U> decode(Bytes&& b) {
    if (b.size() % sizeof(U) != 0)
      throw ClusterError("an item of " + std::to_string(b.size()) + " bytes is not a whole number of elements of " +
                         std::to_string(sizeof(U)) + " bytes");
    std::vector<U> v(b.size() / sizeof(U));
    if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
};

template <>
struct Codec<std::string> {
  static Bytes encode(std::string&& s) {
    Bytes b(s.size());
    std::memcpy(b.data(), s.data(), s.size());
    return b;
  }
  static std::string decode(Bytes&& b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }
};

namespace detail {

/// What a worker's pipeline makes first in `epoch`, before it asks for shards: of the samples
/// in `partial` (units, `position * fanout + j`, ascending) only those units, then the samples
/// at the positions of `whole`.
struct Work {
  std::uint32_t epoch = 0;
  std::uint64_t fanout = 1;  ///< the units of a sample
  std::vector<std::uint64_t> partial;
  UnitRanges whole;  ///< positions, not units
  bool operator==(const Work&) const = default;
};

/// The state a worker's pipeline resumes from to make `work` first: `blank` (the state of a
/// pipeline built the same way, not resumed) set to the work's epoch, with its partly made
/// samples listed. Throws StateError for a deterministic pipeline.
PipelineState start_state(PipelineState blank, const Work& work);

/// The units the consumer of a free-order pipeline took between two of its states of one epoch
/// (`before`, then `after`), as origins, ascending.
std::vector<std::uint64_t> newly_taken(const PipelineState::Taken& before, const PipelineState::Taken& after);

/// One rank's end of a remote edge, moving bytes; thread-safe. A thread of its own drives MPI,
/// so that transfers go on while the pipelines' threads compute.
class Link {
 public:
  virtual ~Link() = default;
  virtual RemoteRole role() const noexcept = 0;
  virtual const RemoteOptions& options() const noexcept = 0;

  /// Worker: what its next pipeline makes first: the trainer's start, or its restart with another
  /// worker's work. Nullopt once the trainer stopped the edge.
  virtual std::optional<Work> next_start() = 0;
  /// Worker: whether the trainer asked for a restart, which its current pipeline makes room for
  /// by ending its epoch at the next sample it would ask a shard for.
  virtual bool restart_pending() const = 0;
  /// Worker: the position in epoch `epoch`'s order of the `call`-th sample of a data set of
  /// `samples` its source reads, from the start's work and then from shards it asks the trainer
  /// for (waiting for the answer); nullopt when the epoch has none left for it, a restart is
  /// pending, or the trainer stopped the edge. Throws PipelineStopped when `stop` is requested
  /// while it waits.
  virtual std::optional<std::uint64_t> position(std::uint32_t epoch, std::uint64_t call, std::uint64_t samples,
                                                std::stop_token stop) = 0;
  /// Worker: the position of a call position() has answered.
  virtual std::uint64_t position_of(std::uint32_t epoch, std::uint64_t call) const = 0;
  /// Worker: sends an item of `epoch` made of `units` once a credit allows it. False when the
  /// trainer stopped the edge. Throws ClusterError when the trainer has sent nothing for twice
  /// the lease while this worker waited for it (here or in an earlier wait since).
  virtual bool send(std::uint32_t epoch, std::uint64_t fanout, std::vector<std::uint64_t> units, Bytes&& item) = 0;
  /// Worker: its pipelines ran their `epochs`; it sends no more.
  virtual void done(std::uint32_t epochs) = 0;
  /// Worker: hands its failure to the trainer and waits (a bounded time) until the trainer has
  /// stopped the edge, so that the trainer reports it.
  virtual void fail(const std::string& stage, const std::string& message) noexcept = 0;

  /// Trainer: the next item of epoch `epoch`, the `index`-th its pipeline's source takes of it;
  /// nullopt once every unit of the epoch has arrived and been taken. Throws RemoteError for a
  /// worker's failure, ClusterError when no worker is left to make the epoch, PipelineStopped
  /// when `stop` is requested.
  virtual std::optional<Bytes> receive(std::uint32_t epoch, std::uint64_t index, std::stop_token stop) = 0;
  /// Trainer: see RemoteEdge::progress().
  virtual RemoteProgress progress(const PipelineState& trainer) const = 0;

  /// Trainer: stops the workers, then waits until each has said its last word (a lost one a
  /// bounded time). Worker: tells the trainer it sends no more, then waits until the trainer has
  /// stopped the edge. Idempotent.
  virtual void close() = 0;
  virtual RemoteStats stats() const = 0;
};

/// Checks the options against the world (naming what is wrong) and opens this rank's end;
/// collective: every rank of the world calls it, in the same order.
std::shared_ptr<Link> open_link(Communicator& comm, RemoteOptions options);

}  // namespace detail

/// A worker's source: samples of a data set, shard by shard as the trainer hands them out.
/// Every epoch the data set is put in a new order drawn from the pipeline's seed and the epoch
/// (ShuffledShard's with one rank); the trainer hands out consecutive ranges of it, `shard`
/// samples at a time, to whichever worker asks first. So each sample of an epoch reaches exactly
/// one worker, and a slow worker takes fewer shards rather than holding back the others.
/// Made by RemoteEdge::serve(), which gives it to the function that builds the worker's pipeline.
class RemoteShards {
 public:
  std::optional<Sample> operator()(const StageContext& ctx);
  /// Nothing to do: the call's index says which sample it is.
  void seek(std::uint64_t) noexcept {}
  std::string fingerprint() const;

 private:
  template <class T>
  friend class RemoteEdge;
  // `link` null: a source that yields nothing, for a pipeline built only to describe itself.
  RemoteShards(std::shared_ptr<detail::Link> link, std::shared_ptr<const Reader> reader);
  std::shared_ptr<detail::Link> link_;
  std::shared_ptr<const Reader> reader_;
  ShuffledShard order_;
};

/// A trainer's source: the items the workers send, epoch by epoch.
template <class T>
class RemoteReceiver {
 public:
  explicit RemoteReceiver(std::shared_ptr<detail::Link> link) : link_(std::move(link)) {}
  /// One item per chunk: a call may wait for the network, and must not hold back those before.
  static constexpr std::size_t max_chunk() { return 1; }
  std::optional<T> operator()(const StageContext& ctx) {
    std::optional<Bytes> bytes;
    {
      const stoker::detail::TurnReleased waiting(ctx);  // the network: no turn of a ThreadBudget held meanwhile
      bytes = link_->receive(ctx.epoch, ctx.index, ctx.stop);
    }
    if (!bytes) return std::nullopt;
    return Codec<T>::decode(std::move(*bytes));
  }
  /// Nothing to do: a resumed trainer's pipeline starts its epoch afresh (RemoteEdge::progress).
  void seek(std::uint64_t) noexcept {}
  std::string fingerprint() const { return "remote edge '" + link_->options().name + "'"; }

 private:
  std::shared_ptr<detail::Link> link_;
};

/// An edge between pipelines on different ranks. Every rank constructs it (a collective), in
/// the same order, inside run_world; then the trainer builds a pipeline whose source is
/// `receiver()`, and each worker serves pipelines that a function of its own builds from a
/// source of shards (and, to resume one, a state):
///
///   stoker::cluster::RemoteEdge<Batch> edge(comm, {.name = "batches", .trainer = 0, .capacity = 8});
///   if (edge.role() == stoker::cluster::RemoteRole::worker) {
///     edge.serve(reader, [&](stoker::cluster::RemoteShards shards, std::optional<stoker::PipelineState> resume) {
///       stoker::PipelineBuilder b;
///       if (resume) b.resume_from(std::move(*resume));
///       return std::move(b).seed(7).epochs(2)
///           .source("read", std::move(shards))
///           .flat_map<Crop>("crops", crops, {.threads = 4, .fanout = 5})
///           .shuffle("shuffle", {.capacity = 10000, .min_after_dequeue = 2000})
///           .batch("batch", 255)
///           .map("collate", collate)
///           .build();
///     });
///   } else if (edge.role() == stoker::cluster::RemoteRole::trainer) {
///     auto pipe = stoker::PipelineBuilder{}.epochs(2).source("batches", edge.receiver())
///                     .map("h2d", to_device).build();
///     for (auto& batch : pipe.epoch()) train(batch);
///   }
///
/// Flow control is by credits: a worker sends only when the trainer has room, so at most
/// `capacity` items are between the workers' pipelines and the trainer's, however slow the
/// trainer. Exactly once, by units (cluster/elastic.h): each item tells the trainer which units
/// it carries (a worker reads them off its pipeline's free-order states, so the worker's
/// pipeline runs in free order and its flat_maps give their fanout), and an epoch ends at the
/// trainer once every unit of it has arrived; no shard of the next epoch is handed out before.
/// A worker that holds work and a credit and sends nothing for the lease is lost: everything it
/// holds goes to another worker, whose pipeline restarts to make it (of the samples the lost one
/// partly sent, only the units that did not arrive), and whatever the lost one sends later is
/// dropped. A worker's failure reaches the trainer's pipeline as a StageError whose original()
/// is a RemoteError naming the worker's rank and stage. The destructor (or close()) of the
/// trainer's edge stops the workers, whose serve() then returns; a worker's waits until the
/// trainer's has done so.
template <class T>
class RemoteEdge {
 public:
  RemoteEdge(Communicator& comm, RemoteOptions options) : link_(detail::open_link(comm, std::move(options))) {}
  ~RemoteEdge() {
    try {
      close();
    } catch (...) {  // destructors never throw; what close() would have said, MPI says again at exit
    }
  }
  RemoteEdge(const RemoteEdge&) = delete;
  RemoteEdge& operator=(const RemoteEdge&) = delete;

  RemoteRole role() const noexcept { return link_->role(); }
  const RemoteOptions& options() const noexcept { return link_->options(); }

  /// Trainer: the source function of its pipeline.
  RemoteReceiver<T> receiver() const {
    expect(RemoteRole::trainer, "receiver()");
    return RemoteReceiver<T>(link_);
  }

  /// Trainer: where training stands, for a checkpoint, given the state of the trainer's pipeline
  /// (free order): the units of its epoch that it has not taken, those received and still in
  /// it included. Give it as RemoteOptions::resume to the edge of the resumed job (of any number
  /// of workers), and resume the trainer's pipeline from `trainer` set to the start of its
  /// epoch (the workers make the units left anew).
  RemoteProgress progress(const PipelineState& trainer) const {
    expect(RemoteRole::trainer, "progress()");
    return link_->progress(trainer);
  }

  /// Worker: serves the pipelines `make(RemoteShards, std::optional<PipelineState>)` builds
  /// (resumed from the state when one is given, which it must be) from `reader`'s data set (all
  /// of it: the trainer hands out its shards; every worker must read the same one), sending each
  /// item to the trainer, epoch by epoch, until the pipeline has run its epochs or the trainer
  /// stops the edge. A restart (another worker's work to make) ends the current pipeline's epoch
  /// early, sends what it holds, and builds another. An exception goes to the trainer first,
  /// then is rethrown here.
  template <class Make>
  void serve(std::shared_ptr<const Reader> reader, Make make) {
    expect(RemoteRole::worker, "serve()");
    try {
      for (;;) {
        std::optional<detail::Work> start = link_->next_start();
        if (!start) return;  // the trainer stopped the edge
        std::optional<PipelineState> resume;
        if (start->epoch != 0 || !start->partial.empty())
          resume = detail::start_state(make(RemoteShards(nullptr, reader), std::nullopt).state(), *start);
        Pipeline<T> pipe = make(RemoteShards(link_, reader), std::move(resume));
        if (!send_all(pipe)) return;
        if (!link_->restart_pending()) {
          link_->done(pipe.current_epoch());  // past its last: the epochs it ran
          return;
        }
      }
    } catch (const std::exception& e) {
      fail(e);
      throw;
    }
  }

  /// Worker: tells the trainer that this worker cannot go on, and why (the stage, for a
  /// StageError), then waits a bounded time until the trainer has stopped the edge, so that
  /// its pipeline reports the error. serve() calls it; call it for an error before serve(),
  /// which would otherwise leave the trainer waiting.
  void fail(const std::exception& e) noexcept {
    if (link_->role() != RemoteRole::worker) return;
    const auto* stage = dynamic_cast<const StageError*>(&e);
    link_->fail(stage ? stage->stage() : std::string(), e.what());
  }

  RemoteStats stats() const { return link_->stats(); }
  /// What the destructor does; throws ClusterError if MPI failed on the way.
  void close() { link_->close(); }

 private:
  // Sends every item of `pipe`'s epochs with the units it carries, until it has run its epochs
  // (true), a restart is pending after an epoch (true), or the trainer stopped the edge (false).
  bool send_all(Pipeline<T>& pipe) {
    PipelineState state = pipe.state();
    const std::uint64_t fanout = units_per_sample(state);
    std::uint32_t epoch = state.epoch;
    PipelineState::Taken before = *state.taken;
    while (!pipe.finished()) {
      for (auto& item : pipe.epoch()) {
        state = pipe.state();
        if (state.epoch != epoch) {  // the consumer took nothing of an epoch at its start
          epoch = state.epoch;
          before = PipelineState::Taken{before.queue, 0, {}};
        }
        std::vector<std::uint64_t> units = detail::newly_taken(before, *state.taken);
        for (auto& u : units) u = link_->position_of(epoch, u / fanout) * fanout + u % fanout;
        before = std::move(*state.taken);
        if (!link_->send(epoch, fanout, std::move(units), Codec<T>::encode(std::move(item)))) {
          pipe.stop();
          return false;
        }
      }
      if (link_->restart_pending()) return true;
    }
    return true;
  }
  void expect(RemoteRole role, const char* call) const {
    if (link_->role() != role)
      throw std::logic_error("remote edge '" + link_->options().name + "': " + call + " is for its " +
                             (role == RemoteRole::trainer ? "trainer" : "workers") + ", not this rank");
  }
  std::shared_ptr<detail::Link> link_;
};

}  // namespace stoker::cluster
