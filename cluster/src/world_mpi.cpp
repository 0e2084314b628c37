// SPDX-License-Identifier: Apache-2.0
// The world over MPI. Every call's error comes back (MPI_ERRORS_RETURN) and is thrown as a
// ClusterError naming the rank and the call.
//
// Collectives are MPI's non-blocking ones, waited for by polling (Communicator says at what
// intervals): Open MPI's blocking collectives spin a core while they wait, and cannot give up.
// While it waits, a rank knows what it waits in (the collective's number, counted from the
// first, and its name); when it gives up (set_timeout), it asks the others, on a communicator of
// the world's own, what they are doing: each rank has a thread, the responder, that answers
// such questions whatever the rest of the process does.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>
#include <utility>

#include <unistd.h>

#include "communicator_impl.h"

namespace stoker::cluster {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string one_decimal(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", v);
  return text;
}

enum Tag : int { kQuery = 1, kReply };

// STOKER_SETUP_TIMEOUT, read at each use (a call's first instruction, before MPI may be running).
std::chrono::milliseconds setup_timeout() {
  const char* text = std::getenv("STOKER_SETUP_TIMEOUT");
  if (!text || !*text) return std::chrono::seconds(120);
  char* end = nullptr;
  const double s = std::strtod(text, &end);
  if (*end != '\0' || !(s >= 0) || s > 1e6)
    throw ClusterError("STOKER_SETUP_TIMEOUT: '" + std::string(text) +
                       "' is not a number of seconds from 0 (no limit) to 1000000");
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
}

// "rank 3 of 4": MPI's numbers once it runs, mpirun's (its environment) before.
std::string this_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return "rank " + std::to_string(rank) + " of " + std::to_string(size);
  }
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (rank && size) return std::string("rank ") + rank + " of " + size;
  return "process " + std::to_string(::getpid());
}

class Mpi final : public Communicator {
 public:
  Mpi() {
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    if (size_ == 1) return;
    {
      SetupDeadline deadline("MPI_Comm_dup");
      check(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    int level = 0;
    MPI_Query_thread(&level);
    // Without MPI_THREAD_MULTIPLE nothing answers, and a timeout says every rank did not.
    if (level == MPI_THREAD_MULTIPLE) responder_ = std::thread([this] { respond(); });
  }
  ~Mpi() override {
    if (responder_.joinable()) {
      {
        std::lock_guard lock(mutex_);
        stopping_ = true;
      }
      wake_.notify_all();
      responder_.join();
    }
    if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
  }
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string engine() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string v(version, static_cast<std::size_t>(length));
    v = v.substr(0, v.find_first_of(",\n"));
    return "MPI (" + v + ")";
  }

  void barrier() override {
    MPI_Request r = MPI_REQUEST_NULL;
    begin("MPI_Barrier", "");
    check(MPI_Ibarrier(MPI_COMM_WORLD, &r), "MPI_Ibarrier");
    wait(r);
  }
  void broadcast(std::span<std::byte> data, int root) override {
    check_root(root, "MPI_Bcast");
    MPI_Request r = MPI_REQUEST_NULL;
    begin("MPI_Bcast", std::to_string(data.size()) + " bytes from rank " + std::to_string(root));
    check(MPI_Ibcast(data.data(), count(data.size(), "MPI_Bcast"), MPI_BYTE, root, MPI_COMM_WORLD, &r), "MPI_Ibcast");
    wait(r);
  }
  void allreduce_sum(std::span<float> data) override {
    // Not in place: Open MPI's non-blocking allreduce takes its slowest algorithm (a reduce to
    // one rank, then a broadcast) for data in place, and reduce-scatter then allgather
    // otherwise, from 4 ranks and 64 KiB (docs/scale-out.md).
    send_.assign(data.begin(), data.end());
    MPI_Request r = MPI_REQUEST_NULL;
    begin("MPI_Allreduce", std::to_string(data.size()) + " floats");
    check(MPI_Iallreduce(send_.data(), data.data(), count(data.size(), "MPI_Allreduce"), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD, &r),
          "MPI_Iallreduce");
    wait(r);
  }
  std::vector<std::string> gather(std::string_view record, int root) override {
    check_root(root, "MPI_Gather");
    int length = count(record.size(), "MPI_Gather");
    // MPI's displacements are ints: every rank learns the total first, so that all of them
    // refuse a gather that would not fit, rather than the root's offsets wrapping around.
    long long total = length;
    MPI_Request r = MPI_REQUEST_NULL;
    begin("MPI_Allreduce", "of the records' total length");
    check(MPI_Iallreduce(MPI_IN_PLACE, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD, &r), "MPI_Iallreduce");
    wait(r);
    if (total > INT_MAX)
      throw ClusterError("rank " + std::to_string(rank_) + ": gather: the records come to " + std::to_string(total) +
                         " bytes, more than MPI's int displacements reach (2 GiB - 1): gather less at a time");
    std::vector<int> lengths(rank_ == root ? static_cast<std::size_t>(size_) : 0);
    begin("MPI_Gather", "of record lengths at rank " + std::to_string(root));
    check(MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, MPI_COMM_WORLD, &r), "MPI_Igather");
    wait(r);
    std::vector<int> offsets(lengths.size());
    std::string all;
    if (rank_ == root) {
      std::exclusive_scan(lengths.begin(), lengths.end(), offsets.begin(), 0);
      all.resize(static_cast<std::size_t>(total));
    }
    begin("MPI_Gatherv", "of records at rank " + std::to_string(root));
    check(MPI_Igatherv(record.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, root,
                       MPI_COMM_WORLD, &r),
          "MPI_Igatherv");
    wait(r);
    std::vector<std::string> records;
    for (std::size_t i = 0; i < lengths.size(); ++i)
      records.push_back(all.substr(static_cast<std::size_t>(offsets[i]), static_cast<std::size_t>(lengths[i])));
    return records;
  }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = std::max(timeout, timeout.zero()); }
  void set_status(std::string_view status) override {
    std::lock_guard lock(mutex_);
    status_.assign(status);
  }
  // Every rank's last collective, on the responder's communicator (a rank that ends while the
  // others still call collectives does not meet theirs), with the timeout of the others: a rank
  // that ends early waits here, not in MPI_Finalize, where an MPI_Abort of another rank (one
  // that stopped answering) leaves Open MPI 4.1's mpirun hanging or crashing in its teardown in
  // about half the runs.
  void final_barrier() {
    MPI_Request r = MPI_REQUEST_NULL;
    begin("MPI_Barrier", "at the end of the job");
    check(MPI_Ibarrier(control_, &r), "MPI_Ibarrier");
    wait(r);
  }
  [[noreturn]] void abort(const std::string& why) noexcept override {
    std::fprintf(stderr, "rank %d of %d: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; should it, this process still ends
  }

 private:
  // A collective begins: the responder says so if asked.
  void begin(const char* call, std::string detail) {
    std::lock_guard lock(mutex_);
    ++collectives_;
    call_ = call;
    call_detail_ = std::move(detail);
    in_call_ = true;
    since_ = Clock::now();
  }

  // Polls `request` until it completes: continuously for the first 50 us, then at a sixteenth
  // of the time waited, 20 us to 1 ms apart; past the timeout, ends the job.
  void wait(MPI_Request& request) {
    const auto start = Clock::now();
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) break;
      const auto waited = Clock::now() - start;
      if (timeout_.count() > 0 && waited >= timeout_) timed_out(waited);
      if (waited < std::chrono::microseconds(50)) {
        std::this_thread::yield();
      } else {
        const auto pause =
            std::clamp<Clock::duration>(waited / 16, std::chrono::microseconds(20), std::chrono::milliseconds(1));
        std::this_thread::sleep_for(pause);
      }
    }
    std::lock_guard lock(mutex_);
    in_call_ = false;
    since_ = Clock::now();
  }

  // What this rank is doing, as the responder tells it: its fields, split by unit separators.
  std::string report() const {
    std::lock_guard lock(mutex_);
    return join({std::to_string(collectives_), in_call_ ? "1" : "0", call_, call_detail_, status_,
                 std::to_string(seconds(Clock::now() - since_))});
  }
  static std::string join(const std::vector<std::string>& fields) {
    std::string out;
    for (const auto& f : fields) (out += f) += '\x1f';
    return out;
  }
  static std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> fields;
    std::istringstream in(text);
    for (std::string f; std::getline(in, f, '\x1f');) fields.push_back(f);
    return fields;
  }

  void respond() {
    std::list<std::pair<MPI_Request, std::string>> replies;  // sends under way, with their bytes
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      for (;;) {
        int found = 0;
        MPI_Message message;
        MPI_Status status;
        if (MPI_Improbe(MPI_ANY_SOURCE, kQuery, control_, &found, &message, &status) != MPI_SUCCESS || !found) break;
        char ignored = 0;
        MPI_Mrecv(&ignored, 0, MPI_CHAR, &message, MPI_STATUS_IGNORE);
        auto& [request, text] = replies.emplace_back(MPI_REQUEST_NULL, report());
        MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, status.MPI_SOURCE, kReply, control_, &request);
      }
      for (auto it = replies.begin(); it != replies.end();) {
        int done = 0;
        MPI_Test(&it->first, &done, MPI_STATUS_IGNORE);
        it = done ? replies.erase(it) : std::next(it);
      }
      lock.lock();
      // A question is answered within 10 ms; an idle responder costs 100 wake-ups a second.
      wake_.wait_for(lock, std::chrono::milliseconds(10), [&] { return stopping_; });
    }
    lock.unlock();
    // A reply still under way goes to a rank that asked because it gave up: the job is ending.
    for (auto& [request, text] : replies) MPI_Request_free(&request);
  }

  struct Answer {
    bool answered = false;
    std::uint64_t collectives = 0;
    bool in_call = false;
    std::string call, detail, status;
    double seconds = 0;
  };

  // Asks `ranks` what they are doing, filling in their answers; waits for them 2 s at most. A
  // late reply to an earlier question (from a rank not asked now) is let go.
  void ask(const std::vector<int>& ranks, std::vector<Answer>& answers) {
    std::vector<char> asked(static_cast<std::size_t>(size_), 0);
    std::vector<MPI_Request> queries(ranks.size(), MPI_REQUEST_NULL);
    char nothing = 0;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      asked[static_cast<std::size_t>(ranks[i])] = 1;
      MPI_Isend(&nothing, 0, MPI_CHAR, ranks[i], kQuery, control_, &queries[i]);
    }
    auto pending = ranks.size();
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (pending > 0 && Clock::now() < deadline) {
      int found = 0;
      MPI_Message message;
      MPI_Status status;
      if (MPI_Improbe(MPI_ANY_SOURCE, kReply, control_, &found, &message, &status) != MPI_SUCCESS) break;
      if (!found) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      int length = 0;
      MPI_Get_count(&status, MPI_CHAR, &length);
      std::string text(static_cast<std::size_t>(length), '\0');
      MPI_Mrecv(text.data(), length, MPI_CHAR, &message, MPI_STATUS_IGNORE);
      const auto from = static_cast<std::size_t>(status.MPI_SOURCE);
      Answer& a = answers[from];
      if (!asked[from] || a.answered) continue;
      a.answered = true;
      --pending;
      if (const auto f = split(text); f.size() == 6) {
        a.collectives = std::strtoull(f[0].c_str(), nullptr, 10);
        a.in_call = f[1] == "1";
        a.call = f[2];
        a.detail = f[3];
        a.status = f[4];
        a.seconds = std::strtod(f[5].c_str(), nullptr);
      }
    }
    for (auto& q : queries) MPI_Request_free(&q);
  }

  // One rank reports a timeout, with O(N) questions in all: the lowest rank that waits in the
  // collective too. Each rank that gives up asks the ranks below it, in windows of 1, 2, 4...,
  // for the lowest one that waits in it too; finding one, it says so in a line and leaves the
  // report, and the end of the job, to that rank (6 s at most: then it ends the job itself).
  // Finding none, it is the reporter: it asks the ranks it has not asked yet. Where rank 0
  // waits too, as it does unless it is the one at fault, each rank asks one question.
  [[noreturn]] void timed_out(Clock::duration waited) {
    std::uint64_t mine = 0;
    std::string call, detail, status;
    {
      std::lock_guard lock(mutex_);
      mine = collectives_;
      call = call_;
      detail = call_detail_;
      status = status_;
    }
    std::string why = call + " #" + std::to_string(mine) + (detail.empty() ? "" : " (" + detail + ")") +
                      " gave up after " + one_decimal(seconds(waited)) + " s (the rank timeout)";
    if (!status.empty()) why += " while this rank was: " + status;
    const auto waits_too = [&](const Answer& a) {
      return a.answered && a.collectives == mine && a.in_call && a.call == call;
    };
    std::vector<Answer> answers(static_cast<std::size_t>(size_));
    int asked = 0;  // ranks 0 to asked - 1
    for (int n = 1; asked < rank_; n *= 2) {
      std::vector<int> window;
      for (int r = asked; r < std::min(asked + n, rank_); ++r) window.push_back(r);
      ask(window, answers);
      asked += static_cast<int>(window.size());
      for (const int r : window) {
        if (!waits_too(answers[static_cast<std::size_t>(r)])) continue;
        std::fprintf(stderr, "rank %d of %d: %s; rank %d, which waits in it too, reports why\n", rank_, size_,
                     why.c_str(), r);
        std::fflush(stderr);
        std::this_thread::sleep_for(std::chrono::seconds(6));  // its MPI_Abort ends this process
        abort(why + "; rank " + std::to_string(r) + ", which waits in it too, did not end the job within 6 s");
      }
    }
    std::vector<int> rest;
    for (int r = rank_ + 1; r < size_; ++r) rest.push_back(r);
    ask(rest, answers);
    // The summary names the ranks that hold this collective up, by what their answers show:
    // those that did not answer, those that have not reached it, those in another collective
    // of the same number. A rank that has passed it (its part is done) holds nothing up.
    std::vector<int> silent, behind, different, waiting;
    std::string about;
    const auto where = [](const Answer& a) {
      return a.call + " #" + std::to_string(a.collectives) + " (" + a.detail + ") for " + one_decimal(a.seconds) + " s";
    };
    const auto done = [](const Answer& a) {
      return std::to_string(a.collectives) + " collectives done, the last " + one_decimal(a.seconds) + " s ago";
    };
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const Answer& a = answers[static_cast<std::size_t>(r)];
      if (waits_too(a)) {
        waiting.push_back(r);  // one line for all of them, after the loop
        continue;
      }
      std::string what;
      if (!a.answered) {
        what = "did not answer within 2 s (stopped, or stuck where nothing of it runs)";
        silent.push_back(r);
      } else if (a.collectives == mine && a.in_call) {
        what = "is in " + a.call + " #" + std::to_string(a.collectives) + " (" + a.detail +
               "): the ranks called different collectives";
        different.push_back(r);
      } else if (a.collectives >= mine) {
        what = "is past it: " + (a.in_call ? "waits in " + where(a) : done(a));
      } else {
        what = "has not reached it: " + (a.in_call ? "waits in " + where(a) : done(a));
        behind.push_back(r);
      }
      if (a.answered && !a.status.empty()) what += "; it was: " + a.status;
      about += "\n  rank " + std::to_string(r) + " " + what;
    }
    if (!waiting.empty())
      about += "\n  " + rank_list(waiting) + (waiting.size() == 1 ? " waits" : " wait") + " in it too";
    if (silent.empty() && behind.empty() && different.empty()) why += "; no other rank holds it up";
    if (!silent.empty()) why += "; " + rank_list(silent) + " stopped answering";
    if (!behind.empty()) why += "; " + rank_list(behind) + (behind.size() == 1 ? " has" : " have") + " not reached it";
    if (!different.empty()) why += "; " + rank_list(different) + " called another collective";
    abort(why + ":" + about);
  }

  void check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw ClusterError("rank " + std::to_string(rank_) + ": " + call +
                       " failed: " + std::string(text, static_cast<std::size_t>(length)));
  }
  void check_root(int root, const char* call) const {
    if (root < 0 || root >= size_)
      throw ClusterError("rank " + std::to_string(rank_) + ": " + call + ": root " + std::to_string(root) +
                         " is not a rank of a world of " + std::to_string(size_));
  }
  // MPI counts are ints.
  int count(std::size_t n, const char* call) const {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw ClusterError("rank " + std::to_string(rank_) + ": " + call + ": " + std::to_string(n) +
                         " elements, more than MPI's int count holds");
    return static_cast<int>(n);
  }

  int rank_ = 0, size_ = 1;
  MPI_Comm control_ = MPI_COMM_NULL;  // the responder's questions and answers
  std::chrono::milliseconds timeout_{0};
  std::vector<float> send_;  // allreduce_sum's copy of the data

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::uint64_t collectives_ = 0;  // begun
  bool in_call_ = false;
  std::string call_ = "no collective", call_detail_, status_;
  Clock::time_point since_ = Clock::now();  // the last collective began or ended
  std::thread responder_;
};

}  // namespace

SetupDeadline::SetupDeadline(std::string call) {
  const auto limit = setup_timeout();
  if (limit.count() == 0) return;
  watcher_ = std::thread([this, limit, call = std::move(call), who = this_rank()] {
    const auto start = Clock::now();
    std::unique_lock lock(mutex_);
    if (done_.wait_for(lock, limit, [this] { return over_; })) return;
    std::fprintf(stderr,
                 "%s: %s has not returned after %.1f s (the setup timeout, STOKER_SETUP_TIMEOUT): a rank stopped, "
                 "died or never started; this rank ends here (exit status 1)\n",
                 who.c_str(), call.c_str(), seconds(Clock::now() - start));
    std::fflush(stderr);
    std::_Exit(1);
  });
}

SetupDeadline::~SetupDeadline() {
  if (!watcher_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    over_ = true;
  }
  done_.notify_all();
  watcher_.join();
}

bool built_with_mpi() noexcept { return true; }

int run_world(int argc, char** argv, const std::function<int(Communicator&)>& main) {
  int provided = 0;
  // Collectives come from the thread that runs `main`, while the responder, and a remote edge's
  // own thread (remote_mpi.cpp), call MPI at the same time: that needs MPI_THREAD_MULTIPLE. A
  // remote edge refuses to open on an MPI that gives less; everything else works with what the
  // MPI gives.
  {
    SetupDeadline deadline("MPI_Init_thread");
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw ClusterError("MPI_Init_thread failed");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  // Under Open MPI's --enable-recovery MPI_Abort ends only the rank that calls it.
  const char* recovery_option = std::getenv("OMPI_MCA_orte_enable_recovery");
  const bool recovery = recovery_option && std::string(recovery_option) == "1";
  int status = 0, size = 1;
  {
    Mpi comm;
    size = comm.size();
    status = run_guarded(comm, main);
    // A rank that never said its last word (stopped, or stuck in its pipeline) would hold
    // MPI_Finalize back for ever: end the job here, with this rank's status.
    if (const auto silent = unresponsive(); !silent.empty() && !recovery) {
      std::fprintf(stderr,
                   "rank %d of %d: %s did not answer at the end: the job ends here (MPI_Abort), as MPI_Finalize would "
                   "wait for it\n",
                   comm.rank(), comm.size(), rank_list(silent).c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, status);
    }
    // A rank that failed ends now: mpirun ends the others when it sees its exit status.
    if (!recovery && comm.size() > 1 && status == 0) comm.final_barrier();
  }
  // Under --enable-recovery a peer may have died, and Open MPI 4.1.4's MPI_Finalize then waits
  // for it in some runs and not in others: each rank of such a job ends without it, with its
  // status, which mpirun --enable-recovery takes as the rank's end.
  if (recovery && size > 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(status);
  }
  SetupDeadline deadline("MPI_Finalize");
  MPI_Finalize();
  return status;
}

}  // namespace stoker::cluster
