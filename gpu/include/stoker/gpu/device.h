// SPDX-License-Identifier: Apache-2.0
// One device interface, two backends: CUDA, and a CPU backend that emulates a device on host
// memory (a stream is an in-order worker thread, an event really records completion), so that
// everything built on this interface runs and is tested on a machine without a GPU.
// Plain C++: no CUDA header here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "stoker/core/stage_stats.h"
#include "stoker/core/timeline.h"

namespace stoker::gpu {

/// True when this build of stoker contains the CUDA backend.
bool built_with_cuda() noexcept;

/// Number of CUDA devices visible to the process; 0 in a build without CUDA, on a
/// machine without a GPU or driver, when CUDA_VISIBLE_DEVICES hides them all, or when CUDA
/// cannot start although a driver is there (cuda_problem() then says why).
int cuda_device_count() noexcept;

/// Why CUDA cannot start on a machine that has a CUDA driver, with CUDA's own error: a driver
/// older than this build's runtime, a device in a bad state. Empty when CUDA answered (with any
/// number of devices), on a machine without a driver, and in a build without CUDA. Device::open
/// ("cuda") puts it in its error; open("auto") logs it before it falls back to the CPU backend.
std::string cuda_problem();

/// Device work that failed: a failed CUDA call, or work that failed after it was issued (a
/// kernel's fault; on either backend, a host task that threw).
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A failed CUDA call: the call, its error string, and where it was made.
class CudaError : public DeviceError {
 public:
  CudaError(int code, const std::string& what) : DeviceError(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

enum class Backend : std::uint8_t { cpu, cuda };
const char* backend_name(Backend b) noexcept;  ///< "cpu" or "cuda"

/// Copies between host and device, counted as they are issued.
struct TransferCounts {
  std::uint64_t h2d_copies = 0, h2d_bytes = 0;
  std::uint64_t d2h_copies = 0, d2h_bytes = 0;
};

/// How Event::synchronize() waits on the host. `spin`, CUDA's default, returns soonest, with
/// a core busy for the whole wait; `block` (cudaEventBlockingSync) puts the thread to sleep
/// until the device signals, a few microseconds later, leaving the core to the pipeline's
/// stages: what a trainer whose host is the bottleneck wants. The CPU backend always blocks.
enum class HostWait : std::uint8_t { spin, block };

/// A point in a stream's work. Recording it again moves the point; waits already issued keep
/// the point they saw, as with CUDA events. Not for concurrent use by several threads.
class Event {
 public:
  virtual ~Event() = default;
  /// True once all the work issued to the stream before the last record() has finished, or
  /// if the event was never recorded. Never waits.
  virtual bool done() = 0;
  /// Waits on the host until done(). The pipeline never calls it; tests and sync mode do.
  /// Both throw DeviceError when the work before the point failed: on CUDA, a CUDA error (a
  /// kernel's fault); on the CPU backend, any failure of the stream the point was recorded on,
  /// a host task that threw included. On CUDA a host task that throws reaches no event.
  virtual void synchronize() = 0;
  /// cudaEvent_t for the CUDA backend, null for the CPU backend: for a framework to make its
  /// own stream wait on it (cudaStreamWaitEvent) without the host waiting. Owned by the event.
  virtual void* native_handle() noexcept = 0;
};

/// An in-order queue of device work. Issuing work never waits for the device.
/// Thread-safe to issue to, but the order of work issued from two threads at once is theirs.
class Stream {
 public:
  virtual ~Stream() = default;
  /// Asynchronous copies. Both buffers must stay valid, and the source unchanged, until an
  /// event recorded after the copy is done.
  virtual void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) = 0;
  virtual void copy_on_device(void* device_dst, const void* device_src, std::size_t bytes) = 0;
  /// Marks the present end of the stream's work.
  virtual void record(Event& event) = 0;
  /// Work issued to this stream from now on starts after `event`'s recorded point. The host
  /// does not wait.
  virtual void wait(Event& event) = 0;
  /// Calls `fn` on a host thread once the work issued before it is done; later work waits for
  /// it. `fn` must not issue work to a stream. If it throws, this stream's check() and
  /// synchronize() report it from then on, on both backends. On the CPU backend the stream is
  /// failed, as a CUDA stream is after a kernel fault: its later work is skipped, and the events
  /// recorded on it after the task, and the streams that wait for them, report the failure. On
  /// CUDA, which cannot fail a stream from the host, its later work runs, and its events and the
  /// streams that wait for them see nothing.
  virtual void host_task(std::function<void()> fn) = 0;
  /// Waits on the host for everything issued so far, then check()s.
  virtual void synchronize() = 0;
  /// Throws the failure of work issued to this stream, if the stream has seen one, as
  /// DeviceError (CudaError for a CUDA error); never waits. Work fails after it was issued, so
  /// this reports it later than the call that issued it: a stage function that issues device
  /// work checks its streams at every call, so that the failure reaches the consumer as a
  /// StageError naming that stage. On CUDA a kernel fault is sticky: every later CUDA call in
  /// the process fails with it, whichever stream it is made on; a host task that threw is
  /// reported by its own stream's check() and synchronize() alone. On the CPU backend a
  /// failure stays with its stream: later work on it is skipped, and the events recorded on it
  /// after the failure, and the streams that wait for them, report it too.
  virtual void check() = 0;
  /// cudaStream_t for the CUDA backend, null for the CPU backend.
  virtual void* native_handle() noexcept = 0;
};

/// Memory of a device, or page-locked host memory: an owner that frees it when destroyed.
class Memory {
 public:
  /// Frees `data`, which belongs to device `device` (the free runs with that device current).
  using Free = void (*)(void* data, int device) noexcept;
  Memory() = default;
  Memory(void* data, std::size_t size, Free free, int device = 0) noexcept
      : data_(static_cast<std::byte*>(data)), size_(size), free_(free), device_(device) {}
  Memory(Memory&& o) noexcept : data_(o.data_), size_(o.size_), free_(o.free_), device_(o.device_) {
    o.data_ = nullptr;
  }
  Memory& operator=(Memory&& o) noexcept {
    Memory old(std::move(*this));
    data_ = o.data_, size_ = o.size_, free_ = o.free_, device_ = o.device_;
    o.data_ = nullptr;
    return *this;
  }
  ~Memory() {
    if (data_) free_(data_, device_);
  }

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  Free free_ = nullptr;
  int device_ = 0;
};

/// A device. Thread-safe. Streams, events and memory it made must not outlive it.
///
/// A CUDA device is one GPU, by its ordinal. Every call that touches it (allocation, streams,
/// events, copies, launches) makes it the calling thread's current device for the duration
/// of the call and then puts back the device that was current: nothing here changes the
/// current device of a caller that chose one, so that code around stoker (a framework, other
/// GPUs of the process) keeps it. A thread that has no CUDA context yet (it never used CUDA:
/// a pipeline's own threads, a consumer that left CUDA to stoker) has chosen nothing; it is
/// left on the device stoker used, with that device's context, as after a CUDA call of its own.
/// (cudaGetDevice says 0 for such a thread: putting 0 back would make a context on GPU 0 for
/// every process of a job.)
class Device {
 public:
  /// "auto": CUDA when a device is visible (the calling thread's current device), else the CPU
  /// backend; "cpu"; "cpu:sticky": the CPU backend with CUDA's sticky faults, for testing what
  /// a program does when its GPU faults (below); "cuda": the calling thread's current CUDA
  /// device; "cuda:N": CUDA device N (as numbered under CUDA_VISIBLE_DEVICES).
  ///
  /// "cpu:sticky": the first failure of work on any of its streams (a host task that threw)
  /// stops the whole device, as a kernel fault stops a CUDA context: no stream runs work after
  /// it, an event recorded after it never passes (done() stays false, as cudaEventQuery may keep
  /// answering "not ready"), a wait on the host (synchronize()) throws the failure, and of the
  /// streams only the one that failed reports it through check(); Device::check() reports it
  /// from any thread. Throws std::runtime_error when this build has no
  /// CUDA backend or the device asked for is not visible (with cuda_problem() when CUDA cannot
  /// start), and std::invalid_argument for anything else (`cuda:x`, `cuda:-1`), naming what it
  /// was given. "auto" on a machine whose CUDA cannot start logs why, as a warning, and opens
  /// the CPU backend.
  static std::shared_ptr<Device> open(std::string_view backend = "auto");

  virtual ~Device() = default;
  virtual Backend backend() const noexcept = 0;
  /// What it is, for logs: "NVIDIA H100 80GB HBM3 (cuda:0)", or "cpu".
  virtual std::string name() const = 0;
  /// The CUDA device's ordinal (N of cuda:N); 0 on the CPU backend.
  virtual int ordinal() const noexcept = 0;

  virtual std::unique_ptr<Stream> make_stream() = 0;
  /// A stream another library made (a framework's cudaStream_t), numbered as DLPack numbers
  /// them: 1 is CUDA's legacy default stream, 2 the per-thread default stream, anything else a
  /// cudaStream_t. Not owned: stoker records events on it and makes it wait, and never destroys
  /// or synchronizes it, and it must live as long as anything stoker was asked to record on it
  /// (SlotPool::record_stream). One object per native stream, kept by the device. Throws
  /// std::invalid_argument for 0 (ambiguous: CUDA's NULL stream is the legacy or the per-thread
  /// one depending on how the caller was compiled) and on the CPU backend, whose streams are its
  /// own (make_stream()).
  virtual std::shared_ptr<Stream> borrow_stream(std::uintptr_t native) = 0;
  /// An event whose synchronize() waits as `wait` says.
  virtual std::unique_ptr<Event> make_event(HostWait wait) = 0;
  std::unique_ptr<Event> make_event() { return make_event(HostWait::spin); }
  /// Device memory; on the CPU backend, host memory. 256-byte aligned. Contents undefined.
  virtual Memory allocate(std::size_t bytes) = 0;
  /// Page-locked host memory, which a device copies from asynchronously (cudaHostAlloc).
  virtual Memory allocate_pinned(std::size_t bytes) = 0;
  /// Bytes allocate() could give now: the device's free memory (the host's available
  /// memory on the CPU backend).
  virtual std::size_t free_memory() const = 0;

  /// Throws, as DeviceError, a fault of the whole device: on CUDA a sticky error (a kernel's
  /// fault), which any of the device's own streams reports, whichever stream's work faulted; on
  /// "cpu:sticky" the failure that stopped it; never on "cpu", whose failures stay with their
  /// streams. Latched: once it has thrown, every later call throws the same. Never waits; costs
  /// a query of each of the device's streams (borrowed ones aside) until a fault is found.
  /// A wait for the device's work checks it at every wake (SlotPool::acquire), so that a fault
  /// that no event it waits for will ever report ends the wait at once.
  virtual void check() {}
  /// Copies issued so far by all of this device's streams.
  TransferCounts transfers() const noexcept;

 protected:
  void count_h2d(std::size_t bytes) noexcept;
  void count_d2h(std::size_t bytes) noexcept;

 private:
  std::atomic<std::uint64_t> h2d_copies_{0}, h2d_bytes_{0}, d2h_copies_{0}, d2h_bytes_{0};
};

/// The device's copy counters as pipeline counters: PipelineBuilder{}.counters(transfer_counters(d))
/// puts them in the summary and the occupancy log.
CounterSource transfer_counters(std::shared_ptr<const Device> device);

/// The device's copies and kernels as spans on one trace track per stream:
/// PipelineBuilder{}.trace(path).timeline(device_timeline(d)). Only while a trace listens does
/// the device time its work: the CPU backend reads the clock in the stream's worker, the CUDA
/// backend records a pair of timing events around each copy and launch and reads them once they
/// have passed, on the host's clock through a reference event (docs/inspect.md, "The trace").
/// One trace at a time per device: a second one refuses to start; stop() stops the device's
/// timeline only if this one started it.
std::shared_ptr<TimelineSource> device_timeline(std::shared_ptr<Device> device);

/// Issues the work that `work` issues to `stream` as one span named `name` (static storage) on
/// the device's timeline while a trace listens, instead of one span per copy and launch: a
/// training step of many small kernels then costs the trace one pair of timing events, not a
/// pair per kernel. Work that `work` issues to other streams is timed as usual. Without a
/// listening timeline, or on a stream that is not a Device's, it just calls `work`.
void timed_work(Stream& stream, const char* name, const std::function<void()>& work);

/// The work one call of `issue` issues to `stream` (a Device's), captured and issued again as a
/// whole: on CUDA a CUDA graph (one launch for all its kernels and copies), on the CPU backend
/// the pieces of work the stream would have run, kept instead. Capturing issues nothing; run()
/// issues the work to the stream it was captured on. The work reads what its pointers point to
/// when it runs, so that a step captured once takes new inputs copied to the same place before
/// each run; what `issue` itself read on the host (a kernel's scalar argument, a pointer) is
/// fixed at capture on both backends: a value that changes from run to run goes through device
/// memory. `issue` must issue to `stream` only, from the calling thread, and neither record nor
/// wait for events, wait on the host, nor run host tasks (the CPU backend throws
/// std::logic_error for an event). A capture that fails (DeviceError on CUDA) leaves the stream
/// as it was. Throws std::logic_error for a stream that is not a Device's.
class Replay {
 public:
  Replay(Stream& stream, const std::function<void()>& issue);
  ~Replay();
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;
  void run();

 private:
  Stream& stream_;
  std::shared_ptr<void> captured_;  // CUDA's executable graph, or the CPU backend's work
};

}  // namespace stoker::gpu
