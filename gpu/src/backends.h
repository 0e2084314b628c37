// SPDX-License-Identifier: Apache-2.0
// The backends behind Device::open, and what gpu/'s kernels need to launch on either.
// Private to gpu/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "stoker/core/timeline.h"
#include "stoker/gpu/device.h"

namespace stoker::gpu::detail {

/// The CPU backend; `sticky`: with CUDA's sticky faults (Device::open("cpu:sticky")).
std::shared_ptr<Device> open_cpu_device(bool sticky);
/// CUDA device `ordinal`, which must be visible. Throws std::runtime_error in a build without
/// CUDA.
std::shared_ptr<Device> open_cuda_device(int ordinal);
/// The calling thread's current CUDA device (0 when it has chosen none, or without CUDA).
int current_cuda_device();

/// Makes a CUDA device the calling thread's current one for as long as it lives, then puts
/// back the device that was current, so that stoker never moves its caller to another device.
/// A thread that has no CUDA context yet (it chose no device) is left on the device used:
/// putting back device 0 would create a context there. Costs a cudaGetDevice when the device
/// is already current (the common case). Does nothing for a CPU-backend stream, and in a build
/// without CUDA.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  /// The device `stream` belongs to.
  explicit DeviceGuard(Stream& stream);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  void enter(int ordinal);
  int previous_ = -1;  // the device to put back; -1 when there is nothing to put back
};

class StreamBase;

/// A stream's timed work, for its device's timeline (device_timeline): spans in the order their
/// work was issued, which on an in-order stream is the order it runs in. Shared by the stream,
/// its device and (CPU backend) the stream's work, so that spans that end after the stream is
/// gone are still taken.
struct StreamSpans {
  using Clock = std::chrono::steady_clock;
  struct Span {
    const char* name = "";
    std::uint64_t bytes = 0;
    Clock::time_point begin, end;  // the CPU backend's, set by the stream's worker
    bool ended = false;            // the CPU backend's: end is set
    bool dropped = false;          // its work or a mark could not be issued: not a span
    bool issued = false;           // its marks and work are issued: no issuing thread touches it now
    bool released = false;         // taken or dropped by the device, which holds it no more
    void* events[2]{};             // the CUDA backend's: recorded before and after the work
  };

  explicit StreamSpans(std::string track) : track(std::move(track)) {}
  const std::string track;  // "cpu stream 3", "cuda:0 stream 3"
  std::mutex issuing;       // held while a span's begin, work and end are issued: they stay together
  std::mutex mutex;         // over the rest, and every Span's fields once it is listed
  std::deque<std::shared_ptr<Span>> spans;
  Clock::time_point last_end;  // of the last span taken; take_timeline()'s alone
  bool closed = false;         // its stream is gone
  // Its stream while it can be asked about a fault of the device (StreamBase::enlist()), under
  // `mutex`: a stream's destructor takes it out before it lets go of anything.
  StreamBase* live = nullptr;
};

/// Base of both backends' devices: gives their streams access to the copy counters, and keeps
/// the timeline of their work.
///
/// Timeline. While a TimelineSource from device_timeline() listens (from its start() to its
/// stop(); one at a time), every copy and launch issued to the device's streams is recorded as a
/// span: StreamBase::timed() brackets the work with marks on the stream, which the backend times
/// (the CPU backend's worker reads the clock; the CUDA backend records timing events), and
/// take() hands out each stream's spans from the front for as long as their work has finished,
/// never overlapping on a track. A timeline starts empty: spans left from an earlier one (work
/// still running as it stopped) are dropped. Timing is best effort: a mark that cannot be issued
/// leaves its work untimed, never failed. When nothing listens, timed() costs one relaxed
/// atomic load.
class DeviceBase : public Device {
 public:
  using Span = StreamSpans::Span;
  void counted_h2d(std::size_t bytes) noexcept { count_h2d(bytes); }
  void counted_d2h(std::size_t bytes) noexcept { count_d2h(bytes); }

  bool timing() const noexcept { return listening_.load(std::memory_order_relaxed); }
  /// Device::check(): the latched fault, else find_fault()'s, latched.
  void check() final;
  /// The spans of a new stream, on a track named after the device (`short_name`) and a number.
  std::shared_ptr<StreamSpans> add_stream(const std::string& short_name);
  /// Throws std::logic_error if a timeline already listens.
  void start_timeline();
  void take_timeline(std::vector<TimedSpan>& out);
  void stop_timeline() noexcept;
  /// Called by timed() once `span`'s marks and work are issued, `timed` false if a mark failed:
  /// gives back what was stored in a span the device had already let go of.
  void issued(StreamSpans& stream, Span& span, bool timed) noexcept;

 protected:
  enum class Resolved : std::uint8_t { pending, ready, lost };
  /// The backend's: `span`'s begin and end once its work has finished (ready), pending until
  /// then, lost when its times can no longer be had (a failed device). From take_timeline()
  /// only, for an issued span of `stream`, without the stream's mutex: the backend takes it if
  /// its stream's work writes the span.
  virtual Resolved resolve(StreamSpans& stream, Span& span) noexcept = 0;
  /// The backend's: called as a timeline starts (may throw: the start fails), and before each
  /// take.
  virtual void timeline_starting() {}
  virtual void before_take() noexcept {}
  /// The backend's: gives back what `span` holds (events). Under the stream's mutex.
  virtual void release(Span& /*span*/) noexcept {}
  /// Drops every stream's spans.
  void drop_spans() noexcept;

 private:
  /// Asks each enlisted stream (StreamBase::query_fault()), under its spans' mutex: the
  /// stream's destructor delists it first.
  void find_fault();
  void give_back(Span& span) noexcept {
    release(span);
    span.released = true;
  }
  /// Forgets the streams that are gone with nothing left to take. Under streams_mutex_.
  void prune_streams() noexcept;

  std::mutex streams_mutex_;
  std::vector<std::shared_ptr<StreamSpans>> streams_;  // this device's, to their spans
  int streams_made_ = 0;

 private:
  std::atomic<bool> listening_{false};
  std::mutex timeline_mutex_;  // start, take and stop
  std::mutex fault_mutex_;
  std::exception_ptr fault_;  // latched by check()
};

/// Base of both backends' streams: issues timed work (copies, launches).
class StreamBase : public Stream {
 public:
  StreamBase(DeviceBase& device, const std::string& short_name)
      : device_(device), spans_(device.add_stream(short_name)) {}
  ~StreamBase() override {
    std::lock_guard lock(spans_->mutex);
    spans_->closed = true;
  }
  /// The backend's: throws a fault of the whole device that this stream reports (a sticky CUDA
  /// error; a stopped "cpu:sticky" device); never a failure of its own work alone (a host task
  /// that threw). For Device::check(), on enlisted streams, from any thread.
  virtual void query_fault() {}

  /// Issues `work` (which issues one copy or launch to this stream, or any number of them) as
  /// a span named `name` (static storage) on the device's timeline, when it listens. Work timed
  /// inside it, by the same thread on this stream, is part of its span, not a span of its own:
  /// a chunk of work costs one pair of marks however many launches it makes (timed_work()).
  /// Issues `work` with no span of its own or inside it: what a CUDA graph captures. Inside
  /// timed() on this thread (a graph captured within timed_work()), it is part of that span.
  template <class Work>
  void untimed(Work&& work) {
    if (chunk_owner_.load(std::memory_order_relaxed) == std::this_thread::get_id()) return work();
    std::lock_guard issuing(spans_->issuing);
    const Owner owner(chunk_owner_);
    work();
  }

  template <class Work>
  void timed(const char* name, std::uint64_t bytes, Work&& work) {
    if (!device_.timing() || chunk_owner_.load(std::memory_order_relaxed) == std::this_thread::get_id()) return work();
    std::lock_guard issuing(spans_->issuing);
    const Owner owner(chunk_owner_);
    auto span = std::make_shared<DeviceBase::Span>();
    span->name = name;
    span->bytes = bytes;
    {
      std::lock_guard lock(spans_->mutex);
      spans_->spans.push_back(span);
    }
    bool marked = best_effort([&] { mark_begin(span); });
    try {
      work();
    } catch (...) {
      device_.issued(*spans_, *span, false);
      throw;
    }
    marked = marked && best_effort([&] { mark_end(span); });
    device_.issued(*spans_, *span, marked);
  }

 protected:
  /// A stream the device's find_fault() may ask (query_fault()): called by the backend's stream
  /// once it is whole; its destructor calls delist() before it lets go of anything.
  void enlist() {
    std::lock_guard lock(spans_->mutex);
    spans_->live = this;
  }
  void delist() noexcept {
    std::lock_guard lock(spans_->mutex);
    spans_->live = nullptr;
  }

  /// Calls `query` unless a thread is issuing to this stream under its issuing lock, a CUDA
  /// graph's capture included (capture_graph() holds it throughout): a query of a stream that
  /// is being captured fails and invalidates the capture. A stream skipped so is asked again at
  /// the next check.
  template <class Query>
  void unless_issuing(Query&& query) {
    if (chunk_owner_.load(std::memory_order_relaxed) == std::this_thread::get_id()) return;
    std::unique_lock issuing(spans_->issuing, std::try_to_lock);
    if (issuing.owns_lock()) query();
  }

  /// The backend's: marks on the stream where `span`'s work begins and ends.
  virtual void mark_begin(const std::shared_ptr<DeviceBase::Span>& span) = 0;
  virtual void mark_end(const std::shared_ptr<DeviceBase::Span>& span) = 0;

  template <class F>
  static bool best_effort(F&& f) noexcept {
    try {
      f();
      return true;
    } catch (...) {
      return false;
    }
  }

  DeviceBase& device_;
  const std::shared_ptr<StreamSpans> spans_;
  // The thread inside timed() or untimed() on this stream, which holds spans_->issuing: what it
  // issues to this stream meanwhile is part of its span (or of no span). Other threads wait for
  // the lock.
  std::atomic<std::thread::id> chunk_owner_{};
  struct Owner {
    std::atomic<std::thread::id>& owner;
    explicit Owner(std::atomic<std::thread::id>& o) : owner(o) { owner.store(std::this_thread::get_id()); }
    ~Owner() { owner.store(std::thread::id{}); }
  };
};

/// What a failure of device work says once it surfaces: `what`, and why it may surface far from
/// the work that failed.
std::string async_failure(const std::string& what);

/// For a destructor that caught a failure while it waited for device work (a sticky CUDA error,
/// the CUDA runtime unloading at exit): logs the first such failure of the process through
/// stoker's log, counts the later ones at debug level, and returns. Call it from a catch block.
void log_teardown_failure(const char* where) noexcept;

/// For a destructor: waits for the work issued to each of `streams` (null ones skipped), and
/// logs a failure of it (log_teardown_failure, naming `where`) rather than throw.
inline void synchronize_quietly(std::initializer_list<Stream*> streams, const char* where) noexcept {
  for (Stream* s : streams) {
    try {
      if (s) s->synchronize();
    } catch (...) {
      log_teardown_failure(where);
    }
  }
}

/// State a library keeps per CUDA stream (a cuBLAS handle, bound to the stream), made by
/// `make` with the stream's device current on first use, and destroyed with the stream after
/// its work. `key` (the address of a static) tells one library's from another's. Throws
/// std::logic_error for a stream that is not a CUDA one.
std::shared_ptr<void> stream_resource(Stream& stream, const void* key,
                                      const std::function<std::shared_ptr<void>()>& make);

/// Captures what `issue` issues to the CUDA stream `stream` into an executable CUDA graph, with
/// the stream's own timing off meanwhile; launch_graph() issues it. Without CUDA they throw
/// std::logic_error: no stream has a native handle there.
std::shared_ptr<void> capture_graph(Stream& stream, const std::function<void()>& issue);
void launch_graph(Stream& stream, void* graph);
/// The CPU backend's capture: the work `issue` issues from this thread to the CPU-backend stream
/// `stream`, kept instead of run, each piece with the arguments it was issued with, as a graph
/// keeps its kernels'; launch_cpu_work() issues it again. Throw std::logic_error for any
/// other stream.
std::shared_ptr<void> capture_cpu_work(Stream& stream, const std::function<void()>& issue);
void launch_cpu_work(Stream& stream, void* work);

/// A named NVTX range for as long as it lives, in a build with CUDA; nothing otherwise.
class TraceRange {
 public:
  explicit TraceRange(const char* name) noexcept;
  ~TraceRange();
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

/// Runs `cpu` in stream order on a CPU-backend stream, or `cuda(cudaStream_t)` on a CUDA one.
/// The one place where a kernel's two implementations meet.
/// The CUDA side runs with the stream's device current.
/// The launch is a span named `name` (static storage) on the device's timeline.
template <class Cpu, class Cuda>
void launch(Stream& stream, const char* name, Cpu&& cpu, Cuda&& cuda) {
  const auto issue = [&] {
    if (void* native = stream.native_handle()) {
      const DeviceGuard guard(stream);
      cuda(native);
    } else {
      stream.host_task(std::forward<Cpu>(cpu));
    }
  };
  // A stream of a Device is a StreamBase; one a user made is not timed.
  if (auto* timed = dynamic_cast<StreamBase*>(&stream))
    timed->timed(name, 0, issue);
  else
    issue();
}

}  // namespace stoker::gpu::detail
