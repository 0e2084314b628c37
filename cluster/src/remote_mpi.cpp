// SPDX-License-Identifier: Apache-2.0
// A remote edge over MPI.
//
// The protocol, on a communicator of the edge's own (MPI_Comm_dup), one tag per kind of message:
//
//   worker -> trainer   request (epoch, samples, start)  a shard of that epoch, please (`start`:
//                                                    the number of starts it has taken, so that
//                                                    a request of a pipeline since replaced is
//                                                    told apart and dropped)
//                       units (epoch, fanout, units) the units the next data message carries
//                       data (an item's bytes)       sent only for a credit
//                       error (stage, message)       the worker's pipeline failed
//                       done (epochs)                the worker's pipelines ran their epochs
//                       bye                          the worker's last message
//   trainer -> worker   start (epoch, work)          build a pipeline at that epoch, making the
//                                                    work first: once to every worker at the
//                                                    open, and again to take over a lost one's
//                       shard (ranges)               positions of the epoch's order; none: no more
//                       credit (n)                   the trainer's pipeline took n of its items
//                       stop                         the trainer's last message
//
// Exactly once is kept by units (elastic.h): the trainer marks the units of every item it
// accepts and an epoch is over once all of them have come; no shard of the next epoch is
// handed out before, so every worker is in the epoch any lost work belongs to. A worker is lost
// when it holds work and a credit and sends nothing for the lease; its work that did not arrive
// goes to another worker in a start, and what it sends later is dropped.
//
// A worker starts with its share of the capacity in credits and gets one back for each item
// the trainer's pipeline takes, so at most `capacity` items are ever sent and not taken. MPI
// keeps the order of the messages from one rank to another on one communicator: a data message
// follows its units, a start follows the shard replies sent before it. The handshake at the
// close (stop, then bye, each the last message of its side) leaves no message unreceived, which
// MPI_Finalize needs; a worker that does not answer is noted, and run_world ends the job rather
// than finalize.
//
// Each end has a thread, the pump, that makes every MPI call of the edge; the pipelines'
// threads hand it what to send and wait for what it receives, under one mutex. It polls (MPI
// has no wait that other threads can interrupt), backing off from yielding to sleeping while
// nothing moves, so that an idle edge costs a few thousand wake-ups a second, not a core (Open
// MPI's blocking calls spin).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "communicator_impl.h"
#include "stoker/cluster/plain_transfer.h"

namespace stoker::cluster::detail {

namespace {

using Clock = std::chrono::steady_clock;

enum Tag : int { kRequest = 1, kShard, kUnits, kData, kError, kDone, kBye, kCredit, kStop, kStart };

// Messages are packed numbers (and vectors of them, after their count).
class Writer {
 public:
  template <class V>
  Writer& put(const V& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(V));
    return *this;
  }
  Writer& put(const std::vector<std::uint64_t>& v) {
    put(static_cast<std::uint64_t>(v.size()));
    for (const auto x : v) put(x);
    return *this;
  }
  Writer& put(const UnitRanges& v) {
    put(static_cast<std::uint64_t>(v.size()));
    for (const auto& [a, b] : v) put(a).put(b);
    return *this;
  }
  Bytes take() {
    Bytes b(bytes_.size());
    if (!bytes_.empty()) std::memcpy(b.data(), bytes_.data(), bytes_.size());
    return b;
  }

 private:
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  explicit Reader(const Bytes& b) : b_(b) {}
  template <class V>
  V get() {
    V v{};
    if (at_ + sizeof(V) > b_.size()) throw ClusterError("remote edge: a message shorter than its contents");
    std::memcpy(&v, b_.data() + at_, sizeof(V));
    at_ += sizeof(V);
    return v;
  }
  std::vector<std::uint64_t> units() {
    std::vector<std::uint64_t> v(count(8));
    for (auto& x : v) x = get<std::uint64_t>();
    return v;
  }
  UnitRanges ranges() {
    UnitRanges v(count(16));
    for (auto& [a, b] : v) {
      a = get<std::uint64_t>();
      b = get<std::uint64_t>();
    }
    return v;
  }

 private:
  std::size_t count(std::size_t each) {
    const auto n = get<std::uint64_t>();
    if (n > (b_.size() - at_) / each) throw ClusterError("remote edge: a message shorter than its contents");
    return static_cast<std::size_t>(n);
  }
  const Bytes& b_;
  std::size_t at_ = 0;
};

// A set of units of an epoch, as bits.
class UnitSet {
 public:
  explicit UnitSet(std::uint64_t units = 0) : words_((units + 63) / 64), size_(units) {}
  std::uint64_t size() const noexcept { return size_; }
  bool has(std::uint64_t u) const noexcept { return (words_[u / 64] >> (u % 64)) & 1; }
  void add(std::uint64_t u) noexcept { words_[u / 64] |= std::uint64_t{1} << (u % 64); }
  void remove(std::uint64_t u) noexcept { words_[u / 64] &= ~(std::uint64_t{1} << (u % 64)); }
  // The units not in the set, as ranges.
  UnitRanges missing() const {
    UnitRanges out;
    for (std::uint64_t u = 0; u < size_;) {
      if (has(u)) {
        ++u;
        continue;
      }
      std::uint64_t end = u + 1;
      while (end < size_ && !has(end)) ++end;
      out.emplace_back(u, end);
      u = end;
    }
    return out;
  }

 private:
  std::vector<std::uint64_t> words_;
  std::uint64_t size_;
};

std::string seconds_text(std::chrono::milliseconds d) { return std::to_string(d.count() / 1000.0).substr(0, 5); }

class MpiLink final : public Link {
 public:
  MpiLink(Communicator& comm, RemoteOptions options) : options_(std::move(options)), rank_(comm.rank()) {
    int level = 0;
    MPI_Query_thread(&level);
    // Every rank dups, also one the edge does not involve: MPI_Comm_dup is collective.
    {
      SetupDeadline deadline("MPI_Comm_dup (a remote edge's communicator)");
      check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    }
    if (level < MPI_THREAD_MULTIPLE)
      fail_open("MPI gives thread level " + std::to_string(level) +
                ", and the edge's thread calls MPI while the program's do: it needs MPI_THREAD_MULTIPLE "
                "(run_world asks for it)");
    const auto& w = options_.workers;
    if (rank_ == options_.trainer) {
      role_ = RemoteRole::trainer;
      index_.assign(static_cast<std::size_t>(comm.size()), -1);
      for (std::size_t i = 0; i < w.size(); ++i) index_[static_cast<std::size_t>(w[i])] = static_cast<int>(i);
      peers_.resize(w.size());
      stats_.worker_samples.assign(w.size(), 0);
      for (std::size_t i = 0; i < w.size(); ++i)
        peers_[i].share = options_.capacity / w.size() + (i < options_.capacity % w.size() ? 1 : 0);
      begin_trainer();
    } else if (const auto it = std::find(w.begin(), w.end(), rank_); it != w.end()) {
      role_ = RemoteRole::worker;
      const auto i = static_cast<std::size_t>(it - w.begin());
      // The capacity split as evenly as it goes: the first `capacity % workers` get one more.
      share_ = options_.capacity / w.size() + (i < options_.capacity % w.size() ? 1 : 0);
    } else {
      role_ = RemoteRole::none;
      return;
    }
    pump_ = std::thread([this] { run(); });
  }
  ~MpiLink() override {
    try {
      close();
    } catch (...) {  // logged by nobody: the edge's owner heard it from close() if it called it
    }
    if (pump_.joinable()) pump_.join();
    MPI_Comm_free(&comm_);
  }

  RemoteRole role() const noexcept override { return role_; }
  const RemoteOptions& options() const noexcept override { return options_; }

  // ---- worker ----

  std::optional<Work> next_start() override {
    std::unique_lock lock(mutex_);
    wait_for_trainer(lock, [&] { return !starts_.empty() || stopped_ || failed(); });
    rethrow_locked();
    if (stopped_) return std::nullopt;
    Work work = std::move(starts_.front());
    starts_.pop_front();
    ++taken_starts_;
    ++stats_.restarts;
    // The new pipeline's source reads the work first: the partly made samples, in order of
    // position (as start_state() lists their units), then the whole ones.
    mine_.clear();
    Mine& m = mine_[work.epoch];
    m.fanout = work.fanout;
    for (const std::uint64_t u : work.partial) m.partial_units.push_back(u);
    m.queued.assign(work.whole.begin(), work.whole.end());
    return work;
  }

  bool restart_pending() const override {
    std::lock_guard lock(mutex_);
    return !starts_.empty();
  }

  std::optional<std::uint64_t> position(std::uint32_t epoch, std::uint64_t call, std::uint64_t samples,
                                        std::stop_token stop) override {
    std::unique_lock lock(mutex_);
    while (!mine_.empty() && mine_.begin()->first + 1 < epoch) mine_.erase(mine_.begin());  // all sent by now
    Mine& m = mine_[epoch];
    for (;;) {
      if (call < m.positions.size()) return m.positions[call];
      if (!m.partial_units.empty()) {  // the start's partly made samples come first, one each
        const std::uint64_t position = m.partial_units.front() / m.fanout;
        while (!m.partial_units.empty() && m.partial_units.front() / m.fanout == position) m.partial_units.pop_front();
        m.positions.push_back(position);
        continue;
      }
      if (!m.queued.empty()) {
        auto& [begin, end] = m.queued.front();
        m.positions.push_back(begin++);
        if (begin == end) m.queued.pop_front();
        continue;
      }
      if (stopped_ || m.none_left || !starts_.empty()) return std::nullopt;
      // Ask the trainer. It may hold the request long (until the epoch's last units have come,
      // a lost worker's included), and says it is there every quarter lease meanwhile.
      reply_.reset();
      request_ = Writer{}.put(epoch).put(samples).put(taken_starts_).take();
      poke_locked();
      const auto answered = [&] { return reply_ || stopped_ || failed() || !starts_.empty(); };
      if (!wait_for_trainer(lock, answered, stop)) throw PipelineStopped();
      rethrow_locked();
      if (!reply_) continue;  // stopped, or a restart: the next round says so
      const UnitRanges shard = std::move(*std::exchange(reply_, std::nullopt));
      if (shard.empty()) m.none_left = true;
      for (const auto& r : shard) m.queued.push_back(r);
    }
  }

  std::uint64_t position_of(std::uint32_t epoch, std::uint64_t call) const override {
    std::lock_guard lock(mutex_);
    const auto it = mine_.find(epoch);
    if (it == mine_.end() || call >= it->second.positions.size())
      throw std::logic_error("remote edge: a unit of a sample its source did not read");
    return it->second.positions[call];
  }

  bool send(std::uint32_t epoch, std::uint64_t fanout, std::vector<std::uint64_t> units, Bytes&& item) override {
    std::unique_lock lock(mutex_);
    wait_for_trainer(lock, [&] { return stopped_ || failed() || outstanding_ < share_; });
    rethrow_locked();
    if (stopped_) return false;
    ++outstanding_;
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, outstanding_);
    ++stats_.items;
    stats_.bytes += item.size();
    outbox_.push_back({kUnits, Writer{}.put(epoch).put(fanout).put(units).take()});
    outbox_.push_back({kData, std::move(item)});
    poke_locked();
    return true;
  }

  void done(std::uint32_t epochs) override {
    std::lock_guard lock(mutex_);
    if (stopped_ || done_queued_) return;
    outbox_.push_back({kDone, Writer{}.put(epochs).take()});
    done_queued_ = true;
    poke_locked();
  }

  void fail(const std::string& stage, const std::string& message) noexcept override {
    try {
      Bytes b(stage.size() + 1 + message.size());
      std::memcpy(b.data(), stage.data(), stage.size());
      b.data()[stage.size()] = std::byte{0};
      std::memcpy(b.data() + stage.size() + 1, message.data(), message.size());
      std::unique_lock lock(mutex_);
      if (stopped_) return;
      outbox_.push_back({kError, std::move(b)});
      poke_locked();
      // The trainer stops the edge once its pipeline has the error; if it never does (it
      // caught the error and went on, or it is stuck), the worker goes on to fail on its own:
      // at the trainer's deadline, or after 30 s without a lease.
      const auto stopped = [&] { return stopped_ || failed(); };
      if (options_.lease.count() > 0)
        wait_for_trainer(lock, stopped);
      else
        changed_.wait_for(lock, std::chrono::seconds(30), stopped);
    } catch (...) {
    }
  }

  // ---- trainer ----

  std::optional<Bytes> receive(std::uint32_t epoch, std::uint64_t index, std::stop_token stop) override {
    std::unique_lock lock(mutex_);
    const auto ready = [&] {
      const Book* b = book_locked(epoch);
      return failed() || closing_ || (b && (!b->items.empty() || b->complete())) || !left_to_make_locked(epoch).empty();
    };
    if (!changed_.wait(lock, stop, ready)) throw PipelineStopped();
    rethrow_locked();
    if (closing_) throw ClusterError("remote edge '" + options_.name + "' is closed");
    // Books of epochs before this one: their items were all taken.
    while (!books_.empty() && books_.begin()->first < epoch) books_.erase(books_.begin());
    const auto found = books_.find(epoch);
    Book* b = found == books_.end() ? nullptr : &found->second;
    if (!b || b->items.empty()) {
      if (b && b->complete()) return std::nullopt;
      throw ClusterError(left_to_make_locked(epoch));
    }
    Held held = std::move(b->items.front());
    b->items.pop_front();
    if (b->taken.size() <= index) b->taken.resize(index + 1);
    b->taken[index] = std::move(held.units);
    --buffered_;
    Peer& p = peers_[static_cast<std::size_t>(held.worker)];
    if (p.buffered-- == p.share) p.progress = Clock::now();  // it could not send: its lease starts now
    if (!p.lost) ++p.credits_due;
    poke_locked();
    return std::move(held.bytes);
  }

  RemoteProgress progress(const PipelineState& trainer) const override {
    if (!trainer.taken)
      throw StateError("remote edge '" + options_.name +
                       "': the trainer's pipeline runs deterministic; its progress needs its free-order state");
    std::lock_guard lock(mutex_);
    if (!fanout_) {  // nothing has arrived yet
      if (options_.resume && options_.resume->epoch == trainer.epoch) return *options_.resume;
      throw StateError("remote edge '" + options_.name + "': no item has arrived yet, so no progress to tell");
    }
    RemoteProgress out{trainer.epoch, *samples_, *fanout_, {}};
    const Book* b = book_locked(trainer.epoch);
    if (!b) {  // an epoch none of whose items arrived yet
      out.left = {{0, *samples_ * *fanout_}};
      return out;
    }
    UnitSet trained = b->accepted;
    const auto untrain = [&](const std::vector<std::uint64_t>& units) {
      for (const auto u : units) trained.remove(u);
    };
    for (const auto& held : b->items) untrain(held.units);  // arrived, not yet taken by the pipeline
    const auto& t = *trainer.taken;
    for (const auto i : t.except)
      if (i < b->taken.size()) untrain(b->taken[i]);
    for (std::uint64_t i = t.below; i < b->taken.size(); ++i) untrain(b->taken[i]);
    out.left = trained.missing();
    return out;
  }

  // ---- both ----

  void close() override {
    if (role_ == RemoteRole::none) return;
    {
      std::unique_lock lock(mutex_);
      if (role_ == RemoteRole::trainer) {
        closing_ = true;
        poke_locked();
        changed_.notify_all();  // a receive() waiting in another thread gives up
      } else {
        if (!stopped_ && !done_queued_) {  // the trainer may still wait for this worker's items
          outbox_.push_back({kDone, Writer{}.put(std::uint32_t{0}).take()});
          done_queued_ = true;
          poke_locked();
        }
        // A trainer that never stops the edge is lost at its deadline: MPI_Finalize would
        // wait for it too.
        wait_for_trainer(lock, [&] { return stopped_ || failed(); });
        // Bye says more than that the edge is stopped: that this process goes on to finalize
        // (a worker whose pipeline is stuck has a pump that would say it all the same).
        closed_ = true;
        poke_locked();
      }
    }
    if (pump_.joinable()) pump_.join();
    std::lock_guard lock(mutex_);
    if (pump_failed_) rethrow_locked();  // a worker's failure was the pipeline's to report
  }

  RemoteStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  struct Outgoing {
    int tag;
    Bytes bytes;
  };
  struct Sending {  // an MPI_Isend and the bytes it reads until it completes
    MPI_Request request;
    Bytes bytes;
  };
  struct Held {  // trainer: an item received and not yet taken, with its units
    int worker = 0;
    Bytes bytes;
    std::vector<std::uint64_t> units;
  };
  struct Book {  // trainer: an epoch's units that arrived, and its items
    UnitSet accepted;
    std::uint64_t count = 0;  // units in `accepted`
    std::deque<Held> items;
    std::vector<std::vector<std::uint64_t>> taken;  // by the trainer's source's index: the units of each item
    bool complete() const { return accepted.size() != 0 && count == accepted.size(); }
  };
  struct Peer {                                 // trainer: one worker
    std::size_t share = 0;                      // its credits
    std::size_t buffered = 0;                   // its items received and not taken
    std::uint32_t credits_due = 0;              // items taken whose credit has not been sent back
    std::uint64_t starts = 0;                   // starts sent to it
    UnitRanges held_positions;                  // whole samples handed to it in the epoch shards are handed of
    std::vector<std::uint64_t> held_units;      // units of partly made samples handed to it
    std::uint64_t whole = 0, arrived = 0;       // samples in held_positions; units arrived from it
    Clock::time_point progress = Clock::now();  // the last item arrived, or work handed with room to send
    std::optional<std::pair<std::uint32_t, std::uint64_t>> waiting;  // a request held: its epoch, samples
    Clock::time_point reassured{};                                   // a credit of 0 sent to it while it waits
    std::optional<std::vector<std::uint64_t>> next_units;            // of its next data message
    std::uint32_t next_epoch = 0;
    std::uint32_t epochs_done = 0;
    bool done = false, bye = false, lost = false;
    Clock::time_point stopped_at{};  // when stop was sent
  };
  struct Mine {  // worker: an epoch's samples its source reads, call by call
    std::vector<std::uint64_t> positions;
    std::deque<std::uint64_t> partial_units;                     // of the start's partly made samples, not yet read
    std::deque<std::pair<std::uint64_t, std::uint64_t>> queued;  // positions handed, not yet read
    std::uint64_t fanout = 1;                                    // of the partly made samples' units
    bool none_left = false;
  };

  // ---- the trainer's books ----

  // At the open: the epoch to make, and each worker's start (work partly done at a resume is
  // shared out among the workers; whole samples are handed out as shards).
  void begin_trainer() {
    std::vector<Work> starts(peers_.size());
    epoch_ = 0;
    if (const auto& r = options_.resume) {
      epoch_ = r->epoch;
      samples_ = r->samples;
      fanout_ = r->fanout;
      Book& b = books_[epoch_];
      b.accepted = UnitSet(r->samples * r->fanout);
      UnitSet left(r->samples * r->fanout);
      for (const auto& [begin, end] : r->left)
        for (std::uint64_t u = begin; u < end && u < left.size(); ++u) left.add(u);
      for (std::uint64_t u = 0; u < left.size(); ++u)
        if (!left.has(u)) {
          b.accepted.add(u);
          ++b.count;
        }
      // Whole samples to the pool; the units of partly trained ones to the workers in turn.
      std::size_t next = 0;
      for (std::uint64_t p = 0; p < r->samples; ++p) {
        std::uint64_t n = 0;
        for (std::uint64_t j = 0; j < r->fanout; ++j) n += left.has(p * r->fanout + j);
        if (n == r->fanout) {
          add_range(pool_, p, p + 1);
        } else if (n != 0) {
          for (std::uint64_t j = 0; j < r->fanout; ++j)
            if (left.has(p * r->fanout + j)) starts[next].partial.push_back(p * r->fanout + j);
          next = (next + 1) % peers_.size();
        }
      }
      pool_ready_ = true;
    }
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      starts[i].epoch = epoch_;
      starts[i].fanout = fanout_.value_or(1);
      hand_locked(i, starts[i]);
      ++peers_[i].starts;
      starts_out_.emplace_back(static_cast<int>(i), std::move(starts[i]));
    }
    if (const Book* b = book_locked(epoch_); b && b->complete()) next_epoch_locked();
  }

  static void add_range(UnitRanges& ranges, std::uint64_t begin, std::uint64_t end) {
    if (!ranges.empty() && ranges.back().second == begin)
      ranges.back().second = end;
    else
      ranges.emplace_back(begin, end);
  }

  const Book* book_locked(std::uint32_t epoch) const {
    const auto it = books_.find(epoch);
    return it == books_.end() ? nullptr : &it->second;
  }

  // Why the trainer's pipeline cannot have the rest of `epoch`: every worker is lost, or done
  // with nothing of it left to send; empty when one may still send.
  std::string left_to_make_locked(std::uint32_t epoch) const {
    if (const Book* b = book_locked(epoch); b && b->complete()) return {};
    const Peer* last_done = nullptr;
    for (const Peer& p : peers_) {
      if (!p.lost && !(p.done && unfinished_count_locked(p) == 0)) return {};
      if (!p.lost) last_done = &p;
    }
    if (last_done)
      return "remote edge '" + options_.name + "': worker rank " +
             std::to_string(options_.workers[static_cast<std::size_t>(last_done - peers_.data())]) +
             " closed its end after " + std::to_string(last_done->epochs_done) +
             " epochs, and the trainer's pipeline wants epoch " + std::to_string(epoch + 1) +
             ": give both sides as many epochs, or stop the trainer first";
    return "remote edge '" + options_.name + "': every worker was lost (" + rank_list(stats_.lost) + "), and epoch " +
           std::to_string(epoch + 1) + " is not whole";
  }

  // Counts `work` as handed to worker i, in the epoch shards are handed of.
  void hand_locked(std::size_t i, const Work& work) {
    Peer& p = peers_[i];
    for (const auto& [begin, end] : work.whole) {
      add_range(p.held_positions, begin, end);
      p.whole += end - begin;
      stats_.worker_samples[i] += end - begin;
    }
    for (const auto u : work.partial) p.held_units.push_back(u);
    if (p.buffered < p.share) p.progress = Clock::now();
  }
  // Units handed to worker i in the current epoch that have not arrived (a whole sample counts
  // its units once the pipelines' fanout is known, 1 before).
  std::uint64_t unfinished_count_locked(const Peer& p) const {
    return p.whole * fanout_.value_or(1) + p.held_units.size() -
           std::min(p.arrived, p.whole * fanout_.value_or(1) + p.held_units.size());
  }

  // The units handed to worker i in the current epoch that have not arrived, as work.
  Work unfinished_locked(std::size_t i) const {
    const Peer& p = peers_[i];
    const std::uint64_t k = fanout_.value_or(1);
    const Book* b = book_locked(epoch_);
    const auto arrived = [&](std::uint64_t u) { return b && b->accepted.size() > u && b->accepted.has(u); };
    Work w{epoch_, k, {}, {}};
    for (const auto& [begin, end] : p.held_positions)
      for (std::uint64_t pos = begin; pos < end; ++pos) {
        std::uint64_t missing = 0;
        for (std::uint64_t j = 0; j < k; ++j) missing += !arrived(pos * k + j);
        if (missing == k)
          add_range(w.whole, pos, pos + 1);
        else
          for (std::uint64_t j = 0; j < k; ++j)
            if (!arrived(pos * k + j)) w.partial.push_back(pos * k + j);
      }
    for (const auto u : p.held_units)
      if (!arrived(u)) w.partial.push_back(u);
    std::sort(w.partial.begin(), w.partial.end());
    return w;
  }

  // Every unit of the current epoch has come: the next one's shards go out now.
  void next_epoch_locked() {
    ++epoch_;
    pool_.clear();
    pool_ready_ = false;
    for (Peer& p : peers_) {
      p.held_positions.clear();
      p.held_units.clear();
      p.whole = p.arrived = 0;
    }
    changed_.notify_all();
  }

  // Worker i's lease ran out: its unfinished work goes to another worker, and it is stopped.
  void lose_locked(std::size_t i, std::vector<std::pair<int, Outgoing>>& out) {
    Peer& p = peers_[i];
    p.lost = true;
    const int rank = options_.workers[i];
    stats_.lost.push_back(rank);
    out.emplace_back(static_cast<int>(i), Outgoing{kStop, Bytes{}});
    p.stopped_at = Clock::now();
    p.waiting.reset();
    Work work = unfinished_locked(i);
    p.held_positions.clear();
    p.held_units.clear();
    p.whole = 0;
    if (work.whole.empty() && work.partial.empty()) return;
    // To the worker with the least unfinished work (it restarts its pipeline to make it).
    std::optional<std::size_t> to;
    for (std::size_t j = 0; j < peers_.size(); ++j) {
      const Peer& q = peers_[j];
      if (q.lost || q.done) continue;
      if (!to || unfinished_count_locked(q) < unfinished_count_locked(peers_[*to])) to = j;
    }
    if (!to) {
      set_failure_locked(ClusterError("remote edge '" + options_.name + "': worker rank " + std::to_string(rank) +
                                      " was lost (it held work and sent nothing for " + seconds_text(options_.lease) +
                                      " s), and no worker is left to make its work"));
      return;
    }
    ++stats_.restarts;
    hand_locked(*to, work);
    ++peers_[*to].starts;
    peers_[*to].waiting.reset();  // a request it held is of the pipeline it replaces
    out.emplace_back(static_cast<int>(*to), Outgoing{kStart, pack_start(work)});
  }

  static Bytes pack_start(const Work& w) {
    return Writer{}.put(w.epoch).put(w.fanout).put(w.partial).put(w.whole).take();
  }

  // ---- the pump ----

  // Every MPI call of the edge is made here. It yields rather than sleeps while a send is under
  // way (a transfer may need this side's progress) and for kSpins rounds after the last thing
  // that moved, then sleeps from 5 us up to 500 us until something moves or a pipeline's thread
  // pokes it.
  static constexpr int kSpins = 64;
  void run() {
    int idle = 0;
    try {
      for (;;) {
        bool moved = complete_sends();
        moved |= role_ == RemoteRole::trainer ? pump_trainer() : pump_worker();
        if (finished()) break;
        if (moved) {
          idle = 0;
        } else if (++idle < kSpins || !sending_.empty() || receiving_live_) {
          std::this_thread::yield();  // a transfer under way needs this side's progress too
        } else {
          const auto pause = std::chrono::microseconds(std::min(500, 5 << std::min(7, (idle - kSpins) / 16)));
          std::unique_lock lock(mutex_);
          wake_.wait_for(lock, pause, [&] { return poke_; });
          poke_ = false;
        }
      }
      // Sends to a rank that does not answer may never complete: they are left to MPI (at once
      // when the trainer is lost: its deadline has passed).
      const auto deadline = Clock::now() + std::chrono::seconds(abandoned() ? 0 : 2);
      while (!complete_sends() && !sending_.empty() && Clock::now() < deadline) std::this_thread::yield();
      for (auto& s : sending_) MPI_Request_free(&s.request);
      sending_.clear();
      abandon_receives();
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::make_exception_ptr(ClusterError(e.what()));
      pump_failed_ = true;
      changed_.notify_all();
    }
  }

  bool finished() {
    std::lock_guard lock(mutex_);
    if (role_ == RemoteRole::worker) return abandoned_ || (sending_.empty() && stopped_ && bye_sent_);
    if (!sending_.empty() && !stop_sent_) return false;
    if (!stop_sent_) return false;
    // After stop, each worker's bye: a lost one's for 2 s, any other's for twice the lease.
    const auto now = Clock::now();
    bool all = true;
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      const Peer& p = peers_[i];
      if (p.bye) continue;
      const auto grace = p.lost ? std::chrono::milliseconds(2000) : 2 * options_.lease;
      if (grace.count() > 0 && now - p.stopped_at > grace) {
        note_unresponsive(options_.workers[i]);
        continue;
      }
      all = false;
    }
    return all;
  }

  bool pump_trainer() {
    std::vector<std::pair<int, Outgoing>> out;  // to worker index
    {
      std::lock_guard lock(mutex_);
      for (auto& s : starts_out_) out.emplace_back(s.first, Outgoing{kStart, pack_start(s.second)});
      starts_out_.clear();
      if (closing_ && !stop_sent_) {
        // The last message to each worker: no credit or shard follows it.
        for (std::size_t i = 0; i < peers_.size(); ++i)
          if (!peers_[i].lost) {
            out.emplace_back(static_cast<int>(i), Outgoing{kStop, Bytes{}});
            peers_[i].stopped_at = Clock::now();
          }
        stop_sent_ = true;
      } else if (!stop_sent_) {
        for (std::size_t i = 0; i < peers_.size(); ++i) {
          Peer& p = peers_[i];
          if (p.lost) continue;
          if (const auto n = std::exchange(p.credits_due, 0))
            out.emplace_back(static_cast<int>(i), Outgoing{kCredit, Writer{}.put(n).take()});
          // Held requests for an epoch that has begun; to one still held, now and then, a word
          // that the trainer is there (a credit of 0).
          if (p.waiting && p.waiting->first <= epoch_) {
            const auto [epoch, samples] = *std::exchange(p.waiting, std::nullopt);
            out.emplace_back(static_cast<int>(i), Outgoing{kShard, pack_shard_locked(i, epoch, samples)});
          } else if (p.waiting && options_.lease.count() > 0 && Clock::now() - p.reassured > options_.lease / 4) {
            p.reassured = Clock::now();
            out.emplace_back(static_cast<int>(i), Outgoing{kCredit, Writer{}.put(std::uint32_t{0}).take()});
          }
        }
        // Leases.
        const auto now = Clock::now();
        if (options_.lease.count() > 0)
          for (std::size_t i = 0; i < peers_.size(); ++i) {
            const Peer& p = peers_[i];
            if (!p.lost && !p.done && unfinished_count_locked(p) > 0 && p.buffered < p.share &&
                now - p.progress > options_.lease)
              lose_locked(i, out);
          }
      }
    }
    for (auto& [i, o] : out) isend(options_.workers[static_cast<std::size_t>(i)], o.tag, std::move(o.bytes));
    bool moved = !out.empty();
    for (int n = 0; n < 16; ++n) {  // what has arrived, a bounded number before sending again
      MPI_Message message;
      MPI_Status status;
      int found = 0;
      check(MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &found, &message, &status), "MPI_Improbe");
      if (!found) break;
      moved = true;
      const int from = status.MPI_SOURCE;
      if (index_[static_cast<std::size_t>(from)] < 0)
        throw ClusterError("rank " + std::to_string(from) + " is not a worker of this edge, but sent to it");
      int count = 0;
      check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
      Receiving& r = receiving_.emplace_back(
          Receiving{MPI_REQUEST_NULL, from, status.MPI_TAG, Bytes(static_cast<std::size_t>(count))});
      check(MPI_Imrecv(r.bytes.data(), count, MPI_BYTE, &message, &r.request), "MPI_Imrecv");
    }
    return finish_receives() || moved;
  }

  // The trainer receives without waiting. A large message comes by rendezvous: matched here, its
  // bytes pulled from the sender afterwards, and a worker killed in between never sends them, so
  // a blocking receive would wait for ever (Open MPI 4.1's shared-memory copy reads the dead
  // process and fails: "Read -1, expected N, errno = 3"). So the bytes of each matched message
  // arrive while the pump goes on; a worker's messages are handed on in the order they were
  // matched, and those of a worker whose receive fails are dropped, the worker lost (its work
  // made again by others), as a lost worker's are. A receive from a dead worker never
  // completes: it stays, read by MPI_Test now and then, and is left to MPI at the end.
  struct Receiving {
    MPI_Request request;
    int from, tag;
    Bytes bytes;  // written by MPI until the request completes
  };

  // Hands on what has arrived; true when something did.
  bool finish_receives() {
    bool delivered = false;
    std::vector<int> behind;  // sources with an earlier receive not complete yet
    for (auto it = receiving_.begin(); it != receiving_.end();) {
      if (std::find(behind.begin(), behind.end(), it->from) != behind.end()) {
        ++it;
        continue;
      }
      int complete = 0;
      const int code = MPI_Test(&it->request, &complete, MPI_STATUS_IGNORE);
      const auto w = static_cast<std::size_t>(index_[static_cast<std::size_t>(it->from)]);
      if (code != MPI_SUCCESS) {  // the worker died during the transfer
        std::vector<std::pair<int, Outgoing>> out;
        {
          std::lock_guard lock(mutex_);
          if (!peers_[w].lost) lose_locked(w, out);
        }
        for (auto& [i, o] : out) isend(options_.workers[static_cast<std::size_t>(i)], o.tag, std::move(o.bytes));
        failed_receives_.push_back(std::move(*it));  // MPI may hold on to it
        it = receiving_.erase(it);
        delivered = true;
        continue;
      }
      if (!complete) {
        behind.push_back(it->from);
        ++it;
        continue;
      }
      Receiving r = std::move(*it);
      it = receiving_.erase(it);
      on_trainer_message(w, r.from, r.tag, std::move(r.bytes));
      delivered = true;
    }
    // Whether the pump should keep MPI's progress going: a transfer from a worker not lost.
    receiving_live_ = false;
    if (!behind.empty()) {
      std::lock_guard lock(mutex_);
      for (const int from : behind)
        if (!peers_[static_cast<std::size_t>(index_[static_cast<std::size_t>(from)])].lost) receiving_live_ = true;
    }
    return delivered;
  }

  // At the end: receives that never completed (a dead worker's) are freed to MPI, and their
  // bytes, which MPI might still write, are kept for the life of the process.
  void abandon_receives() noexcept {
    for (auto& r : receiving_) MPI_Request_free(&r.request);
    if (!receiving_.empty() || !failed_receives_.empty()) {
      auto* kept = new std::list<Receiving>;  // NOLINT: left to the end of the process on purpose
      kept->splice(kept->end(), receiving_);
      kept->splice(kept->end(), failed_receives_);
    }
  }

  // A shard of `epoch` for worker i; none when the epoch has none left (or is over).
  Bytes pack_shard_locked(std::size_t i, std::uint32_t epoch, std::uint64_t samples) {
    UnitRanges shard;
    if (epoch == epoch_ && !stop_sent_) {
      if (!pool_ready_) {
        add_range(pool_, 0, samples);
        pool_ready_ = true;
      }
      std::uint64_t want = options_.shard;
      while (want > 0 && !pool_.empty()) {
        auto& [begin, end] = pool_.front();
        const std::uint64_t n = std::min(want, end - begin);
        shard.emplace_back(begin, begin + n);
        begin += n;
        want -= n;
        if (begin == end) pool_.erase(pool_.begin());
      }
      if (!shard.empty()) {
        ++stats_.shards;
        hand_locked(i, Work{epoch, fanout_.value_or(1), {}, shard});
      }
    }
    return Writer{}.put(shard).take();
  }

  void on_trainer_message(std::size_t w, int from, int tag, Bytes&& b) {
    std::lock_guard lock(mutex_);
    Peer& peer = peers_[w];
    Reader in(b);
    if (tag == kBye) {
      peer.bye = true;
      return;
    }
    if (peer.lost) return;  // whatever a lost worker sends is dropped
    if (tag == kRequest) {
      const auto epoch = in.get<std::uint32_t>();
      const auto samples = in.get<std::uint64_t>();
      const auto starts = in.get<std::uint64_t>();
      if (starts != peer.starts) return;  // of a pipeline that a start replaced
      if (!samples_) {
        samples_ = samples;
        samples_from_ = from;
      } else if (*samples_ != samples) {
        set_failure_locked(ClusterError(
            "remote edge '" + options_.name + "': worker rank " + std::to_string(from) + " reads " +
            std::to_string(samples) + " samples, " +
            (samples_from_ >= 0 ? "worker rank " + std::to_string(samples_from_) : std::string("the checkpoint")) +
            " " + std::to_string(*samples_) + ": every worker must read the same data set"));
        return;
      }
      if (stop_sent_) return;  // the worker learns no more after stop
      if (epoch > epoch_) {
        peer.waiting.emplace(epoch, samples);  // until this epoch is over
        peer.reassured = Clock::now();
        return;
      }
      isend(from, kShard, pack_shard_locked(w, epoch, samples));
    } else if (tag == kUnits) {
      peer.next_epoch = in.get<std::uint32_t>();
      const auto fanout = in.get<std::uint64_t>();
      peer.next_units = in.units();
      if (!fanout_) {
        fanout_ = fanout;
      } else if (*fanout_ != fanout) {
        set_failure_locked(ClusterError("remote edge '" + options_.name + "': worker rank " + std::to_string(from) +
                                        "'s pipeline makes " + std::to_string(fanout) +
                                        " units of a sample, the others' " + std::to_string(*fanout_) +
                                        ": every worker must build the same pipeline"));
      }
    } else if (tag == kData) {
      if (!peer.next_units) throw ClusterError("remote edge '" + options_.name + "': an item without its units");
      accept_locked(w, from, std::move(*std::exchange(peer.next_units, std::nullopt)), std::move(b));
    } else if (tag == kError) {
      const auto* text = reinterpret_cast<const char*>(b.data());
      const std::string stage(text, strnlen(text, b.size()));
      const std::string message(text + std::min(b.size(), stage.size() + 1), text + b.size());
      set_failure_locked(RemoteError(
          from, stage, "worker rank " + std::to_string(from) + " of remote edge '" + options_.name + "': " + message));
    } else if (tag == kDone) {
      peer.done = true;
      peer.epochs_done = in.get<std::uint32_t>();
      changed_.notify_all();
    } else {
      throw ClusterError("remote edge '" + options_.name + "': an unknown message (tag " + std::to_string(tag) +
                         ") from rank " + std::to_string(from));
    }
  }

  void accept_locked(std::size_t w, int from, std::vector<std::uint64_t> units, Bytes&& bytes) {
    Peer& peer = peers_[w];
    if (peer.next_epoch != epoch_)
      throw ClusterError("remote edge '" + options_.name + "': worker rank " + std::to_string(from) +
                         " sent an item of epoch " + std::to_string(peer.next_epoch) + " while epoch " +
                         std::to_string(epoch_) + " is being made");
    Book& b = books_[epoch_];
    if (b.accepted.size() == 0) b.accepted = UnitSet(*samples_ * *fanout_);
    for (const auto u : units) {
      if (u >= b.accepted.size() || b.accepted.has(u))
        throw ClusterError("remote edge '" + options_.name + "': worker rank " + std::to_string(from) + " sent unit " +
                           std::to_string(u) + " of epoch " + std::to_string(epoch_) +
                           (u >= b.accepted.size() ? ", which it has not" : " again"));
      b.accepted.add(u);
    }
    b.count += units.size();
    peer.arrived += units.size();
    peer.progress = Clock::now();
    ++peer.buffered;
    ++buffered_;
    ++stats_.items;
    stats_.bytes += bytes.size();
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, buffered_);
    b.items.push_back(Held{static_cast<int>(w), std::move(bytes), std::move(units)});
    if (b.complete()) next_epoch_locked();
    changed_.notify_all();
  }

  bool pump_worker() {
    std::vector<Outgoing> out;
    bool bye = false;
    {
      std::lock_guard lock(mutex_);
      if (!stopped_) {
        if (request_) out.push_back({kRequest, std::move(*std::exchange(request_, std::nullopt))});
        while (!outbox_.empty()) {
          out.push_back(std::move(outbox_.front()));
          outbox_.pop_front();
        }
      } else if (!bye_sent_ && closed_) {
        bye = bye_sent_ = true;
      }
    }
    for (auto& o : out) isend(options_.trainer, o.tag, std::move(o.bytes));
    if (bye) isend(options_.trainer, kBye, {});  // after every other send: MPI keeps their order
    bool moved = !out.empty() || bye;
    for (int n = 0; n < 16; ++n) {
      MPI_Message message;
      MPI_Status status;
      int found = 0;
      check(MPI_Improbe(options_.trainer, MPI_ANY_TAG, comm_, &found, &message, &status), "MPI_Improbe");
      if (!found) break;
      moved = true;
      Bytes b = receive(message, status);
      Reader in(b);
      std::lock_guard lock(mutex_);
      heard_ = Clock::now();
      waiting_since_.reset();
      if (status.MPI_TAG == kCredit) {  // (0: the trainer holds a request and says it is there)
        outstanding_ -= std::min<std::size_t>(outstanding_, in.get<std::uint32_t>());
      } else if (status.MPI_TAG == kShard) {
        reply_ = in.ranges();
        if (!reply_->empty()) ++stats_.shards;
      } else if (status.MPI_TAG == kStart) {
        Work w;
        w.epoch = in.get<std::uint32_t>();
        w.fanout = in.get<std::uint64_t>();
        w.partial = in.units();
        w.whole = in.ranges();
        starts_.push_back(std::move(w));
      } else if (status.MPI_TAG == kStop) {
        stopped_ = true;
        outbox_.clear();  // never sent: the trainer takes nothing more
      } else {
        throw ClusterError("remote edge '" + options_.name + "': an unknown message (tag " +
                           std::to_string(status.MPI_TAG) + ") from the trainer");
      }
      changed_.notify_all();
    }
    return moved;
  }

  Bytes receive(MPI_Message& message, const MPI_Status& status) {
    int count = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
    Bytes b(static_cast<std::size_t>(count));
    check(MPI_Mrecv(b.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE), "MPI_Mrecv");
    return b;
  }

  void isend(int to, int tag, Bytes&& bytes) {
    if (bytes.size() > static_cast<std::size_t>(INT_MAX))
      throw ClusterError("remote edge '" + options_.name + "': an item of " + std::to_string(bytes.size()) +
                         " bytes, more than MPI's int count holds");
    Sending& s = sending_.emplace_back(Sending{MPI_REQUEST_NULL, std::move(bytes)});
    check(MPI_Isend(s.bytes.data(), static_cast<int>(s.bytes.size()), MPI_BYTE, to, tag, comm_, &s.request),
          "MPI_Isend");
  }

  // True when a send completed.
  bool complete_sends() {
    bool done = false;
    for (auto it = sending_.begin(); it != sending_.end();) {
      int complete = 0;
      check(MPI_Test(&it->request, &complete, MPI_STATUS_IGNORE), "MPI_Test");
      if (complete) {
        it = sending_.erase(it);
        done = true;
      } else {
        ++it;
      }
    }
    return done;
  }

  void check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw ClusterError("rank " + std::to_string(rank_) + ": remote edge '" + options_.name + "': " + call +
                       " failed: " + std::string(text, static_cast<std::size_t>(length)));
  }
  [[noreturn]] void fail_open(const std::string& why) {
    MPI_Comm_free(&comm_);
    throw ClusterError("remote edge '" + options_.name + "': " + why);
  }

  template <class E>
  void set_failure_locked(E error) {
    if (!failure_) failure_ = std::make_exception_ptr(std::move(error));
    changed_.notify_all();
  }
  bool failed() const { return failure_ != nullptr; }
  bool abandoned() {
    std::lock_guard lock(mutex_);
    return abandoned_;
  }

  // A worker waits for the trainer (a start, a shard, a credit, the stop) until `ready()`, or
  // `stop` is requested (then false), or the trainer's deadline: twice the lease after the
  // later of its last message and the first of the waits since (none without a lease). There,
  // the trainer is lost: the edge fails with a ClusterError saying so, every wait ends (each
  // `ready` holds on a failure), and run_world ends the job rather than finalize. So one
  // deadline bounds a trainer gone silent, whatever waits it takes: a credit, then the stop
  // after the worker's failure, then the stop at its close.
  template <class Ready>
  bool wait_for_trainer(std::unique_lock<std::mutex>& lock, Ready ready, std::stop_token stop = {}) {
    if (ready()) return true;  // no wait: the deadline runs only while the worker waits
    if (options_.lease.count() == 0) return changed_.wait(lock, stop, ready);
    if (!waiting_since_) waiting_since_ = Clock::now();
    // A message received meanwhile moves it (and clears waiting_since_).
    const auto deadline = [&] { return std::max(heard_, waiting_since_.value_or(heard_)) + 2 * options_.lease; };
    for (;;) {
      if (changed_.wait_until(lock, stop, deadline(), ready)) return true;
      if (stop.stop_requested()) return false;
      if (Clock::now() < deadline()) continue;
      abandoned_ = true;
      note_unresponsive(options_.trainer);
      set_failure_locked(ClusterError("remote edge '" + options_.name + "': the trainer (rank " +
                                      std::to_string(options_.trainer) + ") has sent nothing for " +
                                      seconds_text(2 * options_.lease) +
                                      " s (twice the lease) while this worker waited for it: it is stuck or stopped"));
      poke_locked();
      return ready();
    }
  }
  void rethrow_locked() const {
    if (failure_) std::rethrow_exception(failure_);
  }
  void poke_locked() {
    poke_ = true;
    wake_.notify_one();
  }

  const RemoteOptions options_;
  const int rank_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  RemoteRole role_ = RemoteRole::none;
  std::thread pump_;

  mutable std::mutex mutex_;
  std::condition_variable_any changed_;  // the pipelines' threads wait on it for the pump
  std::condition_variable wake_;         // the pump, idle, waits on it for them
  bool poke_ = false;
  std::exception_ptr failure_;  // the first error: every call rethrows it
  bool pump_failed_ = false;    // the pump ended on an error of its own (MPI's)
  RemoteStats stats_;
  std::list<Sending> sending_;  // the pump's alone
  std::list<Receiving> receiving_, failed_receives_;  // the trainer's pump's alone, in the order matched
  bool receiving_live_ = false;                       // a receive from a worker not lost is under way

  // trainer (under mutex_)
  std::vector<int> index_;  // a worker's rank -> its index in options_.workers; -1 otherwise
  std::vector<Peer> peers_;
  std::map<std::uint32_t, Book> books_;
  std::uint32_t epoch_ = 0;  // the epoch shards are handed out of
  UnitRanges pool_;          // its positions not handed out yet
  bool pool_ready_ = false;  // filled: a fresh epoch's, once the data set's size is known
  std::size_t buffered_ = 0;
  std::optional<std::uint64_t> samples_, fanout_;
  int samples_from_ = -1;  // the worker whose request said the data set's size (-1: the checkpoint)
  std::vector<std::pair<int, Work>> starts_out_;
  bool closing_ = false, stop_sent_ = false;

  // worker (under mutex_)
  std::size_t share_ = 0;        // its credits
  std::size_t outstanding_ = 0;  // items sent whose credit has not come back
  std::deque<Outgoing> outbox_;
  std::optional<Bytes> request_;
  std::optional<UnitRanges> reply_;
  std::deque<Work> starts_;
  std::uint64_t taken_starts_ = 0;
  std::map<std::uint32_t, Mine> mine_;
  Clock::time_point heard_ = Clock::now();          // the trainer's last message
  std::optional<Clock::time_point> waiting_since_;  // the first wait for the trainer since it spoke
  bool stopped_ = false, bye_sent_ = false, done_queued_ = false, abandoned_ = false, closed_ = false;
};

}  // namespace

std::shared_ptr<Link> open_link(Communicator& comm, RemoteOptions options) {
  return std::make_shared<MpiLink>(comm, checked(comm, std::move(options)));
}

}  // namespace stoker::cluster::detail

namespace stoker::cluster {

double plain_send_recv(Communicator& comm, int receiver, std::size_t bytes, std::size_t count, std::size_t window) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) throw ClusterError("plain_send_recv: messages of at most 2 GiB");
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);  // its own: nothing else's messages match its receives
  const int n = static_cast<int>(bytes);
  int code = MPI_SUCCESS;
  // Waits as an edge's pump does: testing, and yielding the core between tests.
  const auto wait = [&](MPI_Request& r) {
    for (int done = 0; code == MPI_SUCCESS && !done;) {
      code = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::yield();
    }
  };
  comm.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (comm.rank() == receiver) {
    const std::size_t total = count * static_cast<std::size_t>(comm.size() - 1);
    for (std::size_t i = 0; i < total && code == MPI_SUCCESS; ++i) {
      Bytes b(bytes);
      MPI_Request r = MPI_REQUEST_NULL;
      code = MPI_Irecv(b.data(), n, MPI_BYTE, MPI_ANY_SOURCE, 0, c, &r);
      wait(r);
    }
  } else {
    std::deque<std::pair<MPI_Request, Bytes>> sending;
    for (std::size_t i = 0; i < count && code == MPI_SUCCESS; ++i) {
      if (sending.size() == std::max<std::size_t>(window, 1)) {
        wait(sending.front().first);
        sending.pop_front();
      }
      auto& [request, b] = sending.emplace_back(MPI_REQUEST_NULL, Bytes(bytes));
      std::memcpy(b.data(), &i, std::min(bytes, sizeof i));
      if (code == MPI_SUCCESS) code = MPI_Isend(b.data(), n, MPI_BYTE, receiver, 0, c, &request);
    }
    for (auto& [request, b] : sending) wait(request);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Comm_free(&c);
  if (code != MPI_SUCCESS) throw ClusterError("rank " + std::to_string(comm.rank()) + ": plain_send_recv failed");
  return comm.rank() == receiver ? seconds : 0.0;
}

}  // namespace stoker::cluster
