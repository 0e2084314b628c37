// A remote edge over MPI.
//
// The protocol, on a communicator of the edge's own (MPI_Comm_dup), one tag per kind of message:
//
//   worker -> trainer   request (epoch, samples)   a shard of that epoch, please
//                       data (an item's bytes)     sent only for a credit
//                       end (items)                the worker's epoch is over; it sent `items`
//                       error (stage, message)     the worker's pipeline failed
//                       done                       the worker closed its end: it sends no more items
//                       bye                        the worker's last message
//   trainer -> worker   shard (begin, end)         positions of the epoch's order; empty: none left
//                       credit (n)                 the trainer's pipeline took n of its items
//                       stop                       the trainer's last message
//
// A worker starts with its share of the capacity in credits and gets one back for each item
// the trainer's pipeline takes, so at most `capacity` items are ever sent and not taken. MPI
// keeps the order of the messages from one rank to another on one communicator, which is what
// makes `end` a fence: the trainer counts a worker's items into the epoch the worker is in,
// which moves on at each `end`. The handshake at the close (stop, then bye, each the last
// message of its side) leaves no message unreceived, which MPI_Finalize needs.
//
// Each end has a thread, the pump, that makes every MPI call of the edge; the pipelines'
// threads hand it what to send and wait for what it receives, under one mutex. It polls (MPI
// has no wait that other threads can interrupt), backing off from yielding to sleeping while
// nothing moves, so that an idle edge costs a few thousand wake-ups a second, not a core (Open
// MPI's blocking calls spin).
#include <mpi.h>

#include <algorithm>
#include <chrono>
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

enum Tag : int { kRequest = 1, kShard, kData, kEnd, kError, kDone, kBye, kCredit, kStop };

template <class... V>
Bytes pack(const V&... values) {
  Bytes b((sizeof(V) + ... + 0));
  std::size_t at = 0;
  ((std::memcpy(b.data() + at, &values, sizeof(V)), at += sizeof(V)), ...);
  return b;
}
template <class V>
V unpack(const Bytes& b, std::size_t at = 0) {
  V v{};
  if (b.size() >= at + sizeof(V)) std::memcpy(&v, b.data() + at, sizeof(V));
  return v;
}

class MpiLink final : public Link {
 public:
  MpiLink(Communicator& comm, RemoteOptions options) : options_(std::move(options)), rank_(comm.rank()) {
    int level = 0;
    MPI_Query_thread(&level);
    // Every rank dups, also one the edge does not involve: MPI_Comm_dup is collective.
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
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

  std::optional<ShardRange> next_shard(std::uint32_t epoch, std::uint64_t samples, std::stop_token stop) override {
    std::unique_lock lock(mutex_);
    if (stopped_) return std::nullopt;
    reply_.reset();
    request_ = pack(epoch, samples);
    poke_locked();
    if (!changed_.wait(lock, stop, [&] { return reply_ || stopped_ || failed(); }))
      throw PipelineStopped();  // the pipeline stops; so will the edge
    rethrow_locked();
    if (!reply_ || reply_->begin == reply_->end) return std::nullopt;
    return *std::exchange(reply_, std::nullopt);
  }

  bool send(Bytes&& item) override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return stopped_ || failed() || outstanding_ < share_; });
    rethrow_locked();
    if (stopped_) return false;
    ++outstanding_;
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, outstanding_);
    ++stats_.items;
    stats_.bytes += item.size();
    ++sent_in_epoch_;
    outbox_.push_back({kData, std::move(item)});
    poke_locked();
    return true;
  }

  bool end_epoch() override {
    std::lock_guard lock(mutex_);
    if (stopped_) return false;
    outbox_.push_back({kEnd, pack(std::exchange(sent_in_epoch_, 0))});
    poke_locked();
    return true;
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
      // caught the error and went on), the worker goes on to fail on its own.
      changed_.wait_for(lock, std::chrono::seconds(30), [&] { return stopped_ || failed(); });
    } catch (...) {
    }
  }

  // ---- trainer ----

  std::optional<Bytes> receive(std::stop_token stop) override {
    std::unique_lock lock(mutex_);
    // A worker that closed its end before ending this epoch never will.
    const auto gone = [&] {
      return std::find_if(peers_.begin(), peers_.end(), [&](const Peer& p) { return p.done && p.epoch <= taking_; });
    };
    const auto ready = [&] {
      const auto it = epochs_.find(taking_);
      return failed() || closing_ || (it != epochs_.end() && !it->second.items.empty()) ||
             (it != epochs_.end() && it->second.ended == peers_.size()) || gone() != peers_.end();
    };
    if (!changed_.wait(lock, stop, ready)) throw PipelineStopped();
    rethrow_locked();
    if (closing_) throw ClusterError("remote edge '" + options_.name + "' is closed");
    auto& epoch = epochs_[taking_];
    if (const auto p = gone(); epoch.items.empty() && p != peers_.end())
      throw ClusterError("remote edge '" + options_.name + "': worker rank " +
                         std::to_string(options_.workers[static_cast<std::size_t>(p - peers_.begin())]) +
                         " closed its end after " + std::to_string(p->epoch) + " epochs, and the trainer's pipeline " +
                         "wants epoch " + std::to_string(taking_) +
                         " (counted from 0): give both sides as many epochs, or stop the trainer first");
    if (epoch.items.empty()) {  // every worker has ended it
      epochs_.erase(taking_++);
      return std::nullopt;
    }
    auto [worker, bytes] = std::move(epoch.items.front());
    epoch.items.pop_front();
    --buffered_;
    ++peers_[static_cast<std::size_t>(worker)].credits_due;
    poke_locked();
    return std::move(bytes);
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
          outbox_.push_back({kDone, Bytes{}});
          done_queued_ = true;
          poke_locked();
        }
        changed_.wait(lock, [&] { return stopped_ || failed(); });
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
  struct Epoch {  // trainer: an epoch's items received and not yet taken, and the workers done with it
    std::deque<std::pair<int, Bytes>> items;
    std::size_t ended = 0;
  };
  struct Peer {                     // trainer: one worker
    std::uint32_t epoch = 0;        // the epoch its data messages belong to (the ends it sent)
    std::uint64_t items = 0;        // of that epoch, received
    std::uint32_t credits_due = 0;  // items taken whose credit has not been sent back
    bool done = false, bye = false;
  };

  // The pump: every MPI call of the edge is made here. It yields rather than sleeps while a send
  // is under way (a transfer may need this side's progress) and for kSpins rounds after the
  // last thing that moved, then sleeps from 5 us up to 500 us until something moves or a
  // pipeline's thread pokes it.
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
        } else if (++idle < kSpins || !sending_.empty()) {
          std::this_thread::yield();  // a transfer under way needs this side's progress too
        } else {
          const auto pause = std::chrono::microseconds(std::min(500, 5 << std::min(7, (idle - kSpins) / 16)));
          std::unique_lock lock(mutex_);
          wake_.wait_for(lock, pause, [&] { return poke_; });
          poke_ = false;
        }
      }
      while (!complete_sends() && !sending_.empty()) std::this_thread::yield();
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::make_exception_ptr(ClusterError(e.what()));
      pump_failed_ = true;
      changed_.notify_all();
    }
  }

  bool finished() {
    std::lock_guard lock(mutex_);
    if (!sending_.empty()) return false;
    if (role_ == RemoteRole::worker) return stopped_ && bye_sent_;
    return stop_sent_ && std::all_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.bye; });
  }

  bool pump_trainer() {
    bool moved = false;
    std::vector<std::pair<int, Outgoing>> out;  // to worker index
    {
      std::lock_guard lock(mutex_);
      if (closing_ && !stop_sent_) {
        // The last message to each worker: no credit or shard follows it.
        for (std::size_t i = 0; i < peers_.size(); ++i) out.emplace_back(static_cast<int>(i), Outgoing{kStop, Bytes{}});
        stop_sent_ = true;
      } else if (!stop_sent_) {
        for (std::size_t i = 0; i < peers_.size(); ++i)
          if (const auto n = std::exchange(peers_[i].credits_due, 0))
            out.emplace_back(static_cast<int>(i), Outgoing{kCredit, pack(n)});
      }
    }
    for (auto& [i, o] : out) isend(options_.workers[static_cast<std::size_t>(i)], o.tag, std::move(o.bytes));
    moved = !out.empty();
    for (int n = 0; n < 16; ++n) {  // what has arrived, a bounded number before sending again
      MPI_Message message;
      MPI_Status status;
      int found = 0;
      check(MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &found, &message, &status), "MPI_Improbe");
      if (!found) break;
      moved = true;
      const int from = status.MPI_SOURCE;
      Bytes b = receive(message, status);
      const int w = index_[static_cast<std::size_t>(from)];
      if (w < 0) throw ClusterError("rank " + std::to_string(from) + " is not a worker of this edge, but sent to it");
      on_trainer_message(static_cast<std::size_t>(w), from, status.MPI_TAG, std::move(b));
    }
    return moved;
  }

  void on_trainer_message(std::size_t w, int from, int tag, Bytes&& b) {
    Peer& peer = peers_[w];
    if (tag == kRequest) {
      const auto epoch = unpack<std::uint32_t>(b);
      const auto samples = unpack<std::uint64_t>(b, sizeof(std::uint32_t));
      if (!samples_) {
        samples_ = samples;
        samples_from_ = from;
      } else if (*samples_ != samples) {
        set_failure(ClusterError("remote edge '" + options_.name + "': worker rank " + std::to_string(from) +
                                 " reads " + std::to_string(samples) + " samples, worker rank " +
                                 std::to_string(samples_from_) + " " + std::to_string(*samples_) +
                                 ": every worker must read the same data set"));
        return;
      }
      std::uint64_t& next = handed_[epoch];
      const std::uint64_t begin = std::min(next, samples), end = std::min(samples, begin + options_.shard);
      next = end;
      {
        std::lock_guard lock(mutex_);
        if (stop_sent_) return;  // the worker learns no more after stop
        if (end > begin) {
          ++stats_.shards;
          stats_.worker_samples[w] += end - begin;
        }
      }
      isend(from, kShard, pack(begin, end));
    } else if (tag == kData) {
      std::lock_guard lock(mutex_);
      ++peer.items;
      if (stop_sent_) return;  // closing: the pipeline takes no more
      epochs_[peer.epoch].items.emplace_back(static_cast<int>(w), std::move(b));
      ++buffered_;
      ++stats_.items;
      stats_.bytes += epochs_[peer.epoch].items.back().second.size();
      stats_.peak_in_flight = std::max(stats_.peak_in_flight, buffered_);
      changed_.notify_all();
    } else if (tag == kEnd) {
      const auto sent = unpack<std::uint64_t>(b);
      if (sent != peer.items)
        set_failure(ClusterError("remote edge '" + options_.name + "': worker rank " + std::to_string(from) +
                                 " ended epoch " + std::to_string(peer.epoch) + " having sent " + std::to_string(sent) +
                                 " items, but " + std::to_string(peer.items) + " arrived"));
      std::lock_guard lock(mutex_);
      ++epochs_[peer.epoch].ended;
      ++peer.epoch;
      peer.items = 0;
      changed_.notify_all();
    } else if (tag == kError) {
      const auto* text = reinterpret_cast<const char*>(b.data());
      const std::string stage(text, strnlen(text, b.size()));
      const std::string message(text + std::min(b.size(), stage.size() + 1), text + b.size());
      set_failure(RemoteError(
          from, stage, "worker rank " + std::to_string(from) + " of remote edge '" + options_.name + "': " + message));
    } else if (tag == kDone) {
      std::lock_guard lock(mutex_);
      peer.done = true;
      changed_.notify_all();
    } else if (tag == kBye) {
      std::lock_guard lock(mutex_);
      peer.bye = true;
    } else {
      throw ClusterError("remote edge '" + options_.name + "': an unknown message (tag " + std::to_string(tag) +
                         ") from rank " + std::to_string(from));
    }
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
      } else if (!bye_sent_) {
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
      std::lock_guard lock(mutex_);
      if (status.MPI_TAG == kCredit) {
        outstanding_ -= std::min<std::size_t>(outstanding_, unpack<std::uint32_t>(b));
      } else if (status.MPI_TAG == kShard) {
        reply_ = ShardRange{unpack<std::uint64_t>(b), unpack<std::uint64_t>(b, sizeof(std::uint64_t))};
        if (reply_->end > reply_->begin) ++stats_.shards;
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
  void set_failure(E error) {
    std::lock_guard lock(mutex_);
    if (!failure_) failure_ = std::make_exception_ptr(std::move(error));
    changed_.notify_all();
  }
  bool failed() const { return failure_ != nullptr; }
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

  // trainer (under mutex_ where the pipelines' threads read it)
  std::vector<int> index_;  // a worker's rank -> its index in options_.workers; -1 otherwise
  std::vector<Peer> peers_;
  std::map<std::uint32_t, Epoch> epochs_;
  std::uint32_t taking_ = 0;  // the epoch receive() takes from
  std::size_t buffered_ = 0;
  bool closing_ = false, stop_sent_ = false;
  std::map<std::uint32_t, std::uint64_t> handed_;  // the pump's: per epoch, the next position to hand out
  std::optional<std::uint64_t> samples_;           // the pump's: the data set's size, as the first request said
  int samples_from_ = -1;

  // worker
  std::size_t share_ = 0;        // its credits
  std::size_t outstanding_ = 0;  // items sent whose credit has not come back
  std::uint64_t sent_in_epoch_ = 0;
  std::deque<Outgoing> outbox_;
  std::optional<Bytes> request_;
  std::optional<ShardRange> reply_;
  bool stopped_ = false, bye_sent_ = false, done_queued_ = false;
};

}  // namespace

std::shared_ptr<Link> open_link(Communicator& comm, RemoteOptions options) {
  return std::make_shared<MpiLink>(comm, checked(comm, std::move(options)));
}

}  // namespace stoker::cluster::detail

namespace stoker::cluster {

double plain_send_recv(Communicator& comm, int receiver, std::size_t bytes, std::size_t count, std::size_t buffers) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) throw ClusterError("plain_send_recv: messages of at most 2 GiB");
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);  // its own: nothing else's messages match its receives
  std::vector<std::vector<std::byte>> ring(std::max<std::size_t>(buffers, 1),
                                           std::vector<std::byte>(bytes, std::byte{1}));
  const int n = static_cast<int>(bytes);
  comm.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  int code = MPI_SUCCESS;
  if (comm.rank() == receiver) {
    const std::size_t total = count * static_cast<std::size_t>(comm.size() - 1);
    for (std::size_t i = 0; i < total && code == MPI_SUCCESS; ++i)
      code = MPI_Recv(ring[i % ring.size()].data(), n, MPI_BYTE, MPI_ANY_SOURCE, 0, c, MPI_STATUS_IGNORE);
  } else {
    for (std::size_t i = 0; i < count && code == MPI_SUCCESS; ++i)
      code = MPI_Send(ring[i % ring.size()].data(), n, MPI_BYTE, receiver, 0, c);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Comm_free(&c);
  if (code != MPI_SUCCESS) throw ClusterError("rank " + std::to_string(comm.rank()) + ": plain_send_recv failed");
  return comm.rank() == receiver ? seconds : 0.0;
}

}  // namespace stoker::cluster
