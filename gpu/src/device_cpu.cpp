// SPDX-License-Identifier: Apache-2.0
// The CPU backend: device memory is host memory, a stream is a worker thread that runs its
// work in order, and an event completes when that worker reaches it.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "backends.h"

namespace stoker::gpu::detail {

namespace {

// The point one record() marks in a stream's work: done once the stream's worker reaches it,
// with the stream's failure as of then. Each record() makes a new one, and a wait keeps the one
// it saw when it was issued, so that recording the event again (on any stream) moves neither
// when the wait ends nor which failure it carries, as with cudaStreamWaitEvent. Shared with the
// work that completes it and the waits for it: an event may be destroyed with work pending, as
// a CUDA event may.
//
// On a sticky device that has stopped, a point is reached but never passed ("abandoned"): done()
// stays false, as cudaEventQuery may keep answering "not ready" after a fault, while a wait for
// it returns the failure.
struct Point {
  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;
  bool abandoned = false;
  std::string failure;

  void complete(const std::string& stream_failure, bool abandon) {
    {
      std::lock_guard lock(mutex);
      done = true;
      abandoned = abandon;
      failure = stream_failure;
    }
    changed.notify_all();
  }
  /// The failure the work before the point ended in; empty when it succeeded.
  std::string wait() {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return done; });
    return failure;
  }
};

[[noreturn]] void throw_failure(const std::string& failure) { throw DeviceError(async_failure(failure)); }

class CpuEvent final : public Event {
 public:
  bool done() override {
    const auto point = last();
    if (!point) return true;
    std::lock_guard lock(point->mutex);
    if (!point->done || point->abandoned) return false;
    if (!point->failure.empty()) throw_failure(point->failure);
    return true;
  }
  void synchronize() override {
    if (const auto point = last())
      if (auto failure = point->wait(); !failure.empty()) throw_failure(failure);
  }
  void* native_handle() noexcept override { return nullptr; }

  /// The point of the last record(); null before the first.
  std::shared_ptr<Point> last() {
    std::lock_guard lock(mutex_);
    return point_;
  }
  void moved_to(std::shared_ptr<Point> point) {
    std::lock_guard lock(mutex_);
    point_ = std::move(point);
  }

 private:
  std::mutex mutex_;  // record() on one thread, done() on another (a pool's, a consumer's)
  std::shared_ptr<Point> point_;
};

// What stops a sticky device: the first failure of work on any of its streams. Shared by the
// device and its streams' workers.
struct Stop {
  std::atomic<bool> stopped{false};
  std::mutex mutex;
  std::string failure;  // set once, before `stopped`

  void stop(const std::string& what) {
    std::lock_guard lock(mutex);
    if (stopped.load()) return;
    failure = what;
    stopped.store(true);
  }
  std::string why() {
    std::lock_guard lock(mutex);
    return failure;
  }
};

// The worker runs each piece of work with the stream's failure so far (empty while there is
// none): work proper is skipped once there is one, as a CUDA stream's is after a fault, while
// event records and waits still run, to carry the failure on to whoever waits. On a sticky
// device (`stop_` set) the first failure stops every stream: each worker then runs its work
// with that failure, records abandon their points, and no stream but the one that failed
// reports it through check().
class CpuStream final : public StreamBase {
 public:
  CpuStream(DeviceBase& device, Stop* stop) : StreamBase(device, "cpu"), stop_(stop), worker_([this] { work(); }) {
    enlist();
  }
  ~CpuStream() override {
    delist();
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    ready_.notify_one();
    worker_.join();  // after the work already issued: the memory it touches is still there
  }

  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    device_.counted_h2d(bytes);
    copy("h2d", dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    device_.counted_d2h(bytes);
    copy("d2h", dst, src, bytes);
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes) override { copy("d2d", dst, src, bytes); }
  void record(Event& event) override {
    refuse_in_capture();
    auto& cpu = static_cast<CpuEvent&>(event);
    auto point = std::make_shared<Point>();
    issue([this, point](std::string& failure) { point->complete(failure, abandoning_); });
    cpu.moved_to(std::move(point));  // once issued: a point nothing completes would hang its waits
  }
  void wait(Event& event) override {
    refuse_in_capture();
    auto point = static_cast<CpuEvent&>(event).last();
    if (!point) return;  // never recorded: nothing to wait for, as on CUDA
    issue([point = std::move(point)](std::string& failure) {
      auto waited = point->wait();
      if (failure.empty()) failure = std::move(waited);  // work after it would read what failed
    });
  }
  void host_task(std::function<void()> fn) override { issue_work(std::move(fn)); }
  void synchronize() override {
    CpuEvent e;
    record(e);
    e.synchronize();
  }
  void check() override {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) throw_failure(failure_);
  }
  // A stopped sticky device is every stream's to report here, as a sticky CUDA error is.
  void query_fault() override {
    unless_issuing([&] {
      if (stop_ && stop_->stopped.load()) throw_failure(stop_->why());
    });
  }
  void* native_handle() noexcept override { return nullptr; }

  using Work = std::function<void(std::string& failure)>;
  using Captured = std::vector<Work>;

  // Within untimed(), as a CUDA capture: timed work inside `issue` adds no marks to the capture.
  std::shared_ptr<Captured> capture(const std::function<void()>& issue) {
    auto captured = std::make_shared<Captured>();
    untimed([&] {
      {
        std::lock_guard lock(mutex_);
        if (capturing_) throw std::logic_error("Replay: a capture on this stream is already under way");
        capturing_ = captured.get();
        capturer_ = std::this_thread::get_id();
      }
      struct End {
        CpuStream& stream;
        ~End() {
          std::lock_guard lock(stream.mutex_);
          stream.capturing_ = nullptr;
        }
      } end{*this};
      issue();
    });
    return captured;
  }
  // Copies, so that the captured work can run again; each piece through issue(), so that a
  // replay issued inside another capture is captured there, as a graph launch would be.
  void replay(const Captured& captured) {
    timed("graph", 0, [&] {
      for (const Work& work : captured) issue(Work(work));
    });
  }

 private:
  // A point recorded in a capture would be completed by every run: a CUDA graph does not keep
  // event records either.
  void refuse_in_capture() {
    std::lock_guard lock(mutex_);
    if (capturing_ && capturer_ == std::this_thread::get_id())
      throw std::logic_error("Replay: the work it captures on the CPU backend may not record or wait for events");
  }

  void copy(const char* name, void* dst, const void* src, std::size_t bytes) {
    timed(name, bytes, [&] { issue_work([=] { std::memcpy(dst, src, bytes); }); });
  }

  // A span's times are the worker's clock as it reaches the marks.
  void mark_begin(const std::shared_ptr<DeviceBase::Span>& span) override {
    issue([span, spans = spans_](std::string&) {
      std::lock_guard lock(spans->mutex);
      span->begin = StreamSpans::Clock::now();
    });
  }
  void mark_end(const std::shared_ptr<DeviceBase::Span>& span) override {
    issue([span, spans = spans_](std::string&) {
      std::lock_guard lock(spans->mutex);
      span->end = StreamSpans::Clock::now();
      span->ended = true;
    });
  }

  void issue_work(std::function<void()> fn) {
    issue([fn = std::move(fn)](std::string& failure) {
      if (!failure.empty()) return;
      try {
        fn();
      } catch (const std::exception& e) {
        failure = std::string("a host task threw: ") + e.what();
      } catch (...) {
        failure = "a host task threw an exception that is not a std::exception";
      }
    });
  }

  void issue(Work fn) {
    {
      std::lock_guard lock(mutex_);
      if (capturing_ && capturer_ == std::this_thread::get_id()) return capturing_->push_back(std::move(fn));
      work_.push_back(std::move(fn));
    }
    ready_.notify_one();
  }

  void work() {
    std::string failure;  // the worker's own copy of failure_, which it alone writes
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return closing_ || !work_.empty(); });
      if (work_.empty()) return;
      auto fn = std::move(work_.front());
      work_.pop_front();
      lock.unlock();
      if (stop_ && !abandoning_ && stop_->stopped.load()) {
        abandoning_ = true;
        if (failure.empty()) failure = stop_->why();
      }
      const bool failed_before = !failure.empty();
      fn(failure);
      if (stop_ && !failed_before && !failure.empty()) stop_->stop(failure);
      lock.lock();
      if (!failed_before && !failure.empty()) failure_ = failure;
    }
  }

  Stop* const stop_;         // the sticky device's, or null
  bool abandoning_ = false;  // the worker's alone: the device has stopped
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Work> work_;
  std::string failure_;
  bool closing_ = false;
  Captured* capturing_ = nullptr;  // by capturer_ alone: other threads' work runs as usual
  std::thread::id capturer_;
  std::thread worker_;  // last: starts after the members it uses
};

constexpr std::align_val_t kAlign{256};

class CpuDevice final : public DeviceBase {
 public:
  explicit CpuDevice(bool sticky) : stop_(sticky ? std::make_unique<Stop>() : nullptr) {}
  Backend backend() const noexcept override { return Backend::cpu; }
  std::string name() const override { return stop_ ? "cpu:sticky" : "cpu"; }
  int ordinal() const noexcept override { return 0; }
  Resolved resolve(StreamSpans& stream, Span& span) noexcept override {
    std::lock_guard lock(stream.mutex);  // the stream's worker sets the times
    return span.ended ? Resolved::ready : Resolved::pending;
  }
  std::unique_ptr<Stream> make_stream() override { return std::make_unique<CpuStream>(*this, stop_.get()); }
  std::shared_ptr<Stream> borrow_stream(std::uintptr_t native) override {
    throw std::invalid_argument("borrow_stream: the CPU backend has no native streams (asked for stream " +
                                std::to_string(native) + "); use one of its own (Device::make_stream)");
  }
  std::unique_ptr<Event> make_event(HostWait) override { return std::make_unique<CpuEvent>(); }
  Memory allocate(std::size_t bytes) override { return host(bytes); }
  Memory allocate_pinned(std::size_t bytes) override { return host(bytes); }
  std::size_t free_memory() const override {
    return static_cast<std::size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  }

 private:
  static Memory host(std::size_t bytes) {
    return Memory(::operator new[](bytes, kAlign), bytes,
                  [](void* p, int) noexcept { ::operator delete[](p, kAlign); });
  }

  const std::unique_ptr<Stop> stop_;  // "cpu:sticky"
};

}  // namespace

std::shared_ptr<Device> open_cpu_device(bool sticky) { return std::make_shared<CpuDevice>(sticky); }

std::shared_ptr<void> capture_cpu_work(Stream& stream, const std::function<void()>& issue) {
  auto* cpu = dynamic_cast<CpuStream*>(&stream);
  if (!cpu) throw std::logic_error("Replay: not a stream of a Device");
  return cpu->capture(issue);
}

void launch_cpu_work(Stream& stream, void* work) {
  static_cast<CpuStream&>(stream).replay(*static_cast<const CpuStream::Captured*>(work));
}

}  // namespace stoker::gpu::detail
