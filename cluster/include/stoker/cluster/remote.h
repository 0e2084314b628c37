// Remote preprocessing workers: a pipeline cut at one edge, the stages before it on worker
// ranks and those after it on a trainer rank, the edge carrying items between them over MPI,
// with the capacity bound and exactly-once epochs of a queue inside one process.
#pragma once

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
#include "stoker/core/pipeline.h"
#include "stoker/core/stage.h"
#include "stoker/core/stage_error.h"
#include "stoker/stages/reader.h"
#include "stoker/stages/shard.h"

namespace stoker::cluster {

struct RemoteOptions {
  std::string name = "remote";  ///< the edge's name, in its errors
  int trainer = 0;              ///< the rank whose pipeline receives the items
  std::vector<int> workers{};   ///< the ranks whose pipelines send them; empty: every rank but the trainer
  /// Items sent by the workers and not yet taken by the trainer's pipeline, at most: each worker
  /// holds a share of this many credits and sends an item only for one. At least one per worker.
  std::size_t capacity = 8;
  std::uint64_t shard = 256;  ///< samples per shard handed to a worker that asks for work
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

struct ShardRange {
  std::uint64_t begin = 0, end = 0;  ///< positions in the epoch's order of the data set
};

/// One rank's end of a remote edge, moving bytes; thread-safe. A thread of its own drives MPI,
/// so that transfers go on while the pipelines' threads compute.
class Link {
 public:
  virtual ~Link() = default;
  virtual RemoteRole role() const noexcept = 0;
  virtual const RemoteOptions& options() const noexcept = 0;

  /// Worker: the next shard of `epoch` of a data set of `samples`, waiting for the trainer's
  /// answer; nullopt when the epoch has none left, or the trainer stopped the edge. Throws
  /// PipelineStopped when `stop` is requested while it waits.
  virtual std::optional<ShardRange> next_shard(std::uint32_t epoch, std::uint64_t samples, std::stop_token stop) = 0;
  /// Worker: sends an item once a credit allows it. False when the trainer stopped the edge.
  virtual bool send(Bytes&& item) = 0;
  /// Worker: every item of the current epoch has been sent. False when the trainer stopped the edge.
  virtual bool end_epoch() = 0;
  /// Worker: hands its failure to the trainer and waits (a bounded time) until the trainer has
  /// stopped the edge, so that the trainer reports it.
  virtual void fail(const std::string& stage, const std::string& message) noexcept = 0;

  /// Trainer: the next item of the current epoch; nullopt once every worker has ended it.
  /// Throws RemoteError for a worker's failure, PipelineStopped when `stop` is requested.
  virtual std::optional<Bytes> receive(std::stop_token stop) = 0;

  /// Trainer: stops the workers, then waits until each has said its last word. Worker: tells
  /// the trainer it sends no more (a trainer that still waits for its items fails, naming it),
  /// then waits until the trainer has stopped the edge. Idempotent.
  virtual void close() = 0;
  virtual RemoteStats stats() const = 0;
};

/// Checks the options against the world (naming what is wrong) and opens this rank's end;
/// collective: every rank of the world calls it, in the same order.
std::shared_ptr<Link> open_link(Communicator& comm, RemoteOptions options);

}  // namespace detail

/// A worker's source: samples of a data set, shard by shard as the trainer hands them out.
/// Every epoch the data set is put in a new order drawn from the pipeline's seed and the epoch
/// (the order of ShuffledShard with one rank); the trainer hands out consecutive ranges of it,
/// `shard` samples at a time, to whichever worker asks first. So each sample of an epoch reaches
/// exactly one worker, and a slow worker takes fewer shards rather than holding back the
/// others. Not resumable: which worker took which shard is not recorded.
class RemoteShards {
 public:
  static constexpr bool resumable = false;
  RemoteShards(std::shared_ptr<detail::Link> link, std::shared_ptr<const Reader> reader);
  std::optional<Sample> operator()(const StageContext& ctx);

 private:
  std::shared_ptr<detail::Link> link_;
  std::shared_ptr<const Reader> reader_;
  ShuffledShard order_;
  std::uint32_t epoch_ = 0;
  std::uint64_t next_ = 0, end_ = 0;  // the current shard's positions still to read
};

/// A trainer's source: the items the workers send, epoch by epoch. Not resumable.
template <class T>
class RemoteReceiver {
 public:
  static constexpr bool resumable = false;
  explicit RemoteReceiver(std::shared_ptr<detail::Link> link) : link_(std::move(link)) {}
  /// One item per chunk: a call may wait for the network, and must not hold back those before.
  static constexpr std::size_t max_chunk() { return 1; }
  std::optional<T> operator()(const StageContext& ctx) {
    auto bytes = link_->receive(ctx.stop);
    if (!bytes) return std::nullopt;
    return Codec<T>::decode(std::move(*bytes));
  }

 private:
  std::shared_ptr<detail::Link> link_;
};

/// An edge between pipelines on different ranks. Every rank constructs it (a collective), in
/// the same order, inside run_world; then the trainer builds a pipeline whose source is
/// `receiver()`, and each worker one whose source is `shards(reader)` and whose items it hands
/// to `serve()`:
///
///   stoker::cluster::RemoteEdge<Batch> edge(comm, {.name = "batches", .trainer = 0, .capacity = 8});
///   if (edge.role() == stoker::cluster::RemoteRole::worker) {
///     auto pipe = stoker::PipelineBuilder{}.seed(7).epochs(2)
///                     .source("read", edge.shards(reader))
///                     .flat_map<Crop>("crops", crops, {.threads = 4})
///                     .shuffle("shuffle", {.capacity = 10000, .min_after_dequeue = 2000})
///                     .batch("batch", 255)
///                     .map("collate", collate)
///                     .build();
///     edge.serve(pipe);
///   } else if (edge.role() == stoker::cluster::RemoteRole::trainer) {
///     auto pipe = stoker::PipelineBuilder{}.epochs(2).source("batches", edge.receiver())
///                     .map("h2d", to_device).build();
///     for (auto& batch : pipe.epoch()) train(batch);
///   }
///
/// Flow control is by credits: a worker sends only when the trainer has room, so at most
/// `capacity` items are between the workers' pipelines and the trainer's, however slow the
/// trainer. An epoch ends at the trainer once every worker has sent all of its shards' items.
/// A worker's failure reaches the trainer's pipeline as a StageError whose original() is a
/// RemoteError naming the worker's rank and stage. The destructor (or close()) of the trainer's
/// edge stops the workers, whose serve() then returns; a worker's waits until the trainer's
/// has done so.
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
  /// Worker: the source function of its pipeline, reading `reader`'s data set (all of it: the
  /// trainer hands out its shards). Every worker must read the same data set.
  RemoteShards shards(std::shared_ptr<const Reader> reader) const {
    expect(RemoteRole::worker, "shards()");
    return RemoteShards(link_, std::move(reader));
  }

  /// Worker: sends every item of `pipe` to the trainer, epoch by epoch, until `pipe` has run
  /// its epochs or the trainer stops the edge (then `pipe` is stopped). An exception from `pipe`
  /// goes to the trainer first, then is rethrown here.
  void serve(Pipeline<T>& pipe) {
    expect(RemoteRole::worker, "serve()");
    try {
      while (!pipe.finished()) {
        for (auto& item : pipe.epoch()) {
          if (!link_->send(Codec<T>::encode(std::move(item)))) {
            pipe.stop();
            return;
          }
        }
        if (!link_->end_epoch()) {
          pipe.stop();
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
  /// such as data this worker cannot read, which would otherwise leave the trainer waiting.
  void fail(const std::exception& e) noexcept {
    if (link_->role() != RemoteRole::worker) return;
    const auto* stage = dynamic_cast<const StageError*>(&e);
    link_->fail(stage ? stage->stage() : std::string(), e.what());
  }

  RemoteStats stats() const { return link_->stats(); }
  /// What the destructor does; throws ClusterError if MPI failed on the way.
  void close() { link_->close(); }

 private:
  void expect(RemoteRole role, const char* call) const {
    if (link_->role() != role)
      throw std::logic_error("remote edge '" + link_->options().name + "': " + call + " is for its " +
                             (role == RemoteRole::trainer ? "trainer" : "workers") + ", not this rank");
  }
  std::shared_ptr<detail::Link> link_;
};

}  // namespace stoker::cluster
