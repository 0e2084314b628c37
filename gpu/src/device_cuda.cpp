// SPDX-License-Identifier: Apache-2.0
// The CUDA backend. Every call goes through STOKER_CUDA_CHECK; destructors never throw.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "stoker/core/body_tracer.h"

#include "backends.h"
#include "cuda_check.h"

namespace stoker::gpu {

bool built_with_cuda() noexcept { return true; }

namespace {

// What cudaGetDeviceCount answered, asked once: the answer does not change while the process
// runs, and a failed first call would otherwise be made again, and fail again, at every ask.
struct CudaStart {
  int devices = 0;
  std::string problem;
};

const CudaStart& cuda_start() {
  static const CudaStart start = [] {
    CudaStart s;
    const cudaError_t error = cudaGetDeviceCount(&s.devices);
    if (error == cudaSuccess) return s;
    (void)cudaGetLastError();
    s.devices = 0;
    // No device, or no driver at all (the runtime then reports driver version 0), is a machine
    // without a GPU: an answer, not a problem.
    int driver = 0, runtime = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    if (error == cudaErrorNoDevice || driver == 0) return s;
    const auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    s.problem = std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error) + " (driver supports CUDA " +
                version(driver) + ", this build's runtime is CUDA " + version(runtime) + ")";
    return s;
  }();
  return start;
}

}  // namespace

int cuda_device_count() noexcept {
  try {
    return cuda_start().devices;
  } catch (...) {  // only std::bad_alloc could come from building the message
    return 0;
  }
}

std::string cuda_problem() { return cuda_start().problem; }

namespace detail {

TraceRange::TraceRange(const char* name) noexcept { nvtxRangePushA(name); }
TraceRange::~TraceRange() { nvtxRangePop(); }

int current_cuda_device() {
  int device = 0;
  STOKER_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

namespace {

// Whether the calling thread has a CUDA context current, asked of the driver (cuCtxGetCurrent,
// reached through the runtime so that stoker needs no libcuda at link time). Unknown is taken
// as yes: the guard then puts the device back, as it promises.
bool thread_has_context() {
  using GetCurrent = CUresult (*)(CUcontext*);
  static const GetCurrent get_current = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return GetCurrent{};
    }
    return reinterpret_cast<GetCurrent>(fn);
  }();
  CUcontext context = nullptr;
  return !get_current || get_current(&context) != CUDA_SUCCESS || context != nullptr;
}

}  // namespace

DeviceGuard::DeviceGuard(int ordinal) { enter(ordinal); }

void DeviceGuard::enter(int ordinal) {
  const int current = current_cuda_device();
  if (current == ordinal) return;
  // A thread with no context yet has chosen no device (cudaGetDevice says 0 all the same):
  // putting device 0 back would make it one there, a context on GPU 0 for every process of a
  // multi-GPU job. Such a thread is left on the device stoker used.
  const bool chosen = thread_has_context();
  STOKER_CUDA_CHECK(cudaSetDevice(ordinal));
  if (chosen) previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // it was current a moment ago
}

namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(int device, unsigned flags) : device_(device) {
    const DeviceGuard guard(device_);
    STOKER_CUDA_CHECK(cudaEventCreateWithFlags(&event, flags));
  }
  ~CudaEvent() override {
    try {
      const DeviceGuard guard(device_);
      (void)cudaEventDestroy(event);
    } catch (...) {
      log_teardown_failure("a CUDA event's destructor");
    }
  }
  bool done() override {
    const DeviceGuard guard(device_);
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    STOKER_CUDA_CHECK(status);
    return true;
  }
  void synchronize() override {
    const DeviceGuard guard(device_);
    STOKER_CUDA_CHECK(cudaEventSynchronize(event));
  }
  void* native_handle() noexcept override { return event; }
  cudaEvent_t event{};

 private:
  int device_;
};

// What the CUDA device does for its streams' timelines.
class Timing {
 public:
  virtual cudaEvent_t timing_event() = 0;  ///< a timing event from the device's pool
 protected:
  ~Timing() = default;
};

class CudaStream final : public StreamBase {
 public:
  CudaStream(DeviceBase& device, Timing& timing)
      : StreamBase(device, "cuda:" + std::to_string(device.ordinal())), timing_(timing), ordinal_(device.ordinal()) {
    const DeviceGuard guard(ordinal_);
    // Non-blocking: no implicit ordering with the legacy default stream.
    STOKER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    enlist();  // not a borrowed one: its owner may destroy it while the device has it
  }
  /// Another library's stream (Device::borrow_stream): used, never synchronized or destroyed.
  CudaStream(DeviceBase& device, Timing& timing, cudaStream_t borrowed)
      : StreamBase(device, "cuda:" + std::to_string(device.ordinal()) + " borrowed"),
        timing_(timing),
        ordinal_(device.ordinal()),
        stream_(borrowed),
        owned_(false) {}
  ~CudaStream() override {
    delist();
    if (!owned_) return;
    bool unloading = false;
    try {
      const DeviceGuard guard(ordinal_);
      unloading = cudaStreamSynchronize(stream_) == cudaErrorCudartUnloading;
      if (!unloading) resources_.clear();  // with the stream's device current
      (void)cudaStreamDestroy(stream_);
    } catch (...) {
      unloading = true;  // no device to destroy the handles with
      log_teardown_failure("a CUDA stream's destructor");
    }
    // Once CUDA's runtime is unloading (process exit), a library handle must not be destroyed:
    // its destructor would call into the runtime that is gone. The process ends anyway.
    if (unloading && !resources_.empty()) new std::vector<Resource>(std::move(resources_));
  }

  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    copy("h2d", dst, src, bytes, cudaMemcpyHostToDevice);
    device_.counted_h2d(bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    copy("d2h", dst, src, bytes, cudaMemcpyDeviceToHost);
    device_.counted_d2h(bytes);
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes) override {
    copy("d2d", dst, src, bytes, cudaMemcpyDeviceToDevice);
  }
  void record(Event& event) override {
    const DeviceGuard guard(ordinal_);
    STOKER_CUDA_CHECK(cudaEventRecord(static_cast<CudaEvent&>(event).event, stream_));
  }
  void wait(Event& event) override {
    const DeviceGuard guard(ordinal_);
    STOKER_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<CudaEvent&>(event).event, 0));
  }
  void host_task(std::function<void()> fn) override {
    const DeviceGuard guard(ordinal_);
    auto* task = new HostTask{std::move(fn), this};
    const cudaError_t status = cudaLaunchHostFunc(stream_, &HostTask::run, task);
    if (status != cudaSuccess) delete task;
    STOKER_CUDA_CHECK(status);
  }
  void synchronize() override {
    {
      const DeviceGuard guard(ordinal_);
      STOKER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    check();
  }
  void check() override {
    {
      std::lock_guard lock(mutex_);
      if (!host_failure_.empty()) throw DeviceError(async_failure(host_failure_));
    }
    query();
  }
  // A sticky error is the context's: the query of any of its streams reports it.
  void query_fault() override {
    unless_issuing([&] { query(); });
  }
  void* native_handle() noexcept override { return stream_; }

  int ordinal() const noexcept { return ordinal_; }
  std::shared_ptr<void> resource(const void* key, const std::function<std::shared_ptr<void>()>& make) {
    std::lock_guard lock(mutex_);
    for (const auto& [k, r] : resources_)
      if (k == key) return r;
    const DeviceGuard guard(ordinal_);
    resources_.emplace_back(key, make());
    return resources_.back().second;
  }

 private:
  void query() {
    const DeviceGuard guard(ordinal_);
    const cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return;
    }
    STOKER_CUDA_CHECK(status);
  }
  void copy(const char* name, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    const DeviceGuard guard(ordinal_);
    timed(name, bytes, [&] { STOKER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_)); });
  }

  // A span's times are those of timing events recorded before and after its work.
  void mark_begin(const std::shared_ptr<DeviceBase::Span>& span) override { mark(*span, 0); }
  void mark_end(const std::shared_ptr<DeviceBase::Span>& span) override { mark(*span, 1); }
  void mark(DeviceBase::Span& span, int which) {
    const DeviceGuard guard(ordinal_);
    cudaEvent_t event = timing_.timing_event();
    const cudaError_t status = cudaEventRecord(event, stream_);
    std::lock_guard lock(spans_->mutex);
    span.events[which] = event;  // the span gives it back to the pool, recorded or not
    STOKER_CUDA_CHECK(status);
  }

  // A host task that throws cannot fail the CUDA stream it runs on; the stream keeps the failure
  // for check() to report. It outlives its tasks: its destructor waits for them.
  struct HostTask {
    std::function<void()> fn;
    CudaStream* stream;
    static void run(void* p) {
      std::unique_ptr<HostTask> task(static_cast<HostTask*>(p));
      try {
        task->fn();
      } catch (const std::exception& e) {
        task->stream->failed(std::string("a host task threw: ") + e.what());
      } catch (...) {
        task->stream->failed("a host task threw an exception that is not a std::exception");
      }
    }
  };
  void failed(std::string what) noexcept {
    try {
      std::lock_guard lock(mutex_);
      if (host_failure_.empty()) host_failure_ = std::move(what);
    } catch (...) {
    }
  }

  using Resource = std::pair<const void*, std::shared_ptr<void>>;
  Timing& timing_;
  const int ordinal_;
  cudaStream_t stream_{};
  const bool owned_ = true;
  std::mutex mutex_;
  std::string host_failure_;
  std::vector<Resource> resources_;  // destroyed before the stream, after its work
};

// Frees memory of device `device` with that device current, as it was allocated.
template <cudaError_t (*Free)(void*)>
void free_on(void* p, int device) noexcept {
  try {
    const DeviceGuard guard(device);
    (void)Free(p);
  } catch (...) {
    log_teardown_failure("freeing CUDA memory");
  }
}

class CudaDevice final : public DeviceBase, private Timing {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    // The properties of a device are read without making it current: open() moves nobody.
    cudaDeviceProp props{};
    STOKER_CUDA_CHECK(cudaGetDeviceProperties(&props, ordinal_));
    name_ = std::string(props.name) + " (cuda:" + std::to_string(ordinal_) + ")";
    // Stage bodies as NVTX ranges, next to the copies and kernels in a profile. NVTX calls
    // cost a few nanoseconds when no profiler listens.
    set_body_tracer({[](const char* stage) { nvtxRangePushA(stage); }, [] { nvtxRangePop(); }});
  }
  Backend backend() const noexcept override { return Backend::cuda; }
  std::string name() const override { return name_; }
  int ordinal() const noexcept override { return ordinal_; }
  ~CudaDevice() override {
    try {
      borrowed_.clear();  // streams go before the device
      drop_spans();       // their events come back to the pool
      const DeviceGuard guard(ordinal_);
      for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
      if (reference_) (void)cudaEventDestroy(reference_);
    } catch (...) {
      log_teardown_failure("a CUDA device's destructor");
    }
  }
  std::unique_ptr<Stream> make_stream() override {
    return std::make_unique<CudaStream>(*this, static_cast<Timing&>(*this));
  }
  std::shared_ptr<Stream> borrow_stream(std::uintptr_t native) override {
    if (native == 0)
      throw std::invalid_argument(
          "borrow_stream: stream 0 is ambiguous; 1 is CUDA's legacy default stream, 2 the per-thread one");
    const auto handle = native == 1   ? cudaStreamLegacy
                        : native == 2 ? cudaStreamPerThread
                                      : reinterpret_cast<cudaStream_t>(native);
    std::lock_guard lock(borrowed_mutex_);
    auto& stream = borrowed_[native];
    if (!stream) stream = std::make_shared<CudaStream>(*this, static_cast<Timing&>(*this), handle);
    return stream;
  }
  std::unique_ptr<Event> make_event(HostWait wait) override {
    return std::make_unique<CudaEvent>(ordinal_,
                                       cudaEventDisableTiming | (wait == HostWait::block ? cudaEventBlockingSync : 0u));
  }
  Memory allocate(std::size_t bytes) override {
    const DeviceGuard guard(ordinal_);
    void* p = nullptr;
    STOKER_CUDA_CHECK(cudaMalloc(&p, bytes));
    return Memory(p, bytes, &free_on<cudaFree>, ordinal_);
  }
  Memory allocate_pinned(std::size_t bytes) override {
    const DeviceGuard guard(ordinal_);
    void* p = nullptr;
    STOKER_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    return Memory(p, bytes, &free_on<cudaFreeHost>, ordinal_);
  }
  std::size_t free_memory() const override {
    const DeviceGuard guard(ordinal_);
    std::size_t free = 0, total = 0;
    STOKER_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }

 private:
  cudaEvent_t timing_event() override {
    {
      std::lock_guard lock(pool_mutex_);
      if (!pool_.empty()) {
        cudaEvent_t e = pool_.back();
        pool_.pop_back();
        return e;
      }
    }
    const DeviceGuard guard(ordinal_);
    cudaEvent_t e{};
    STOKER_CUDA_CHECK(cudaEventCreate(&e));  // with timing
    return e;
  }
  void release(Span& span) noexcept override {
    try {
      std::lock_guard lock(pool_mutex_);
      for (void*& e : span.events)
        if (e) pool_.push_back(static_cast<cudaEvent_t>(std::exchange(e, nullptr)));
    } catch (...) {  // no memory for the pool: the events stay until the process ends
    }
  }

  // The device's clock is read against the host's through a reference event: recorded on an
  // idle stream, it passes between the host's clock readings before and after it, and is taken
  // to pass halfway (tried again while those readings are more than 50 us apart, up to 3
  // times). cudaEventElapsedTime's float milliseconds lose precision far from the reference, and
  // the two clocks drift apart, so a new one is taken every 10 s; take_timeline() keeps the
  // spans of a track from overlapping where two references disagree.
  void timeline_starting() override { take_reference(); }
  void before_take() noexcept override {
    if (StreamSpans::Clock::now() - reference_time_ < std::chrono::seconds(10)) return;
    try {
      take_reference();
    } catch (...) {  // the spans read through the old one, or are lost with the device
    }
  }
  void take_reference() {
    const DeviceGuard guard(ordinal_);
    if (!reference_) STOKER_CUDA_CHECK(cudaEventCreate(&reference_));
    cudaStream_t idle{};
    STOKER_CUDA_CHECK(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking));
    cudaError_t status = cudaSuccess;
    for (int attempt = 0; attempt < 3 && status == cudaSuccess; ++attempt) {
      const auto before = StreamSpans::Clock::now();
      status = cudaEventRecord(reference_, idle);
      if (status == cudaSuccess) status = cudaEventSynchronize(reference_);
      const auto after = StreamSpans::Clock::now();
      reference_time_ = before + (after - before) / 2;
      if (after - before <= std::chrono::microseconds(50)) break;
    }
    (void)cudaStreamDestroy(idle);
    STOKER_CUDA_CHECK(status);
  }
  Resolved resolve(StreamSpans&, Span& span) noexcept override {
    if (!span.events[0] || !span.events[1]) return Resolved::lost;
    try {
      const DeviceGuard guard(ordinal_);
      const auto end = static_cast<cudaEvent_t>(span.events[1]);
      const cudaError_t status = cudaEventQuery(end);
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return Resolved::pending;
      }
      float begin_ms = 0, end_ms = 0;
      if (status != cudaSuccess ||
          cudaEventElapsedTime(&begin_ms, reference_, static_cast<cudaEvent_t>(span.events[0])) != cudaSuccess ||
          cudaEventElapsedTime(&end_ms, reference_, end) != cudaSuccess) {
        (void)cudaGetLastError();
        return Resolved::lost;
      }
      const auto at = [&](float ms) {
        return reference_time_ +
               std::chrono::duration_cast<StreamSpans::Clock::duration>(std::chrono::duration<double, std::milli>(ms));
      };
      span.begin = at(begin_ms), span.end = at(end_ms);
      return Resolved::ready;
    } catch (...) {  // the device guard could not make the device current
      return Resolved::lost;
    }
  }

  const int ordinal_;
  std::string name_;
  std::mutex pool_mutex_;
  std::vector<cudaEvent_t> pool_;  // timing events, under pool_mutex_
  cudaEvent_t reference_{};        // the timeline's sampling thread's, as is the time below
  StreamSpans::Clock::time_point reference_time_;
  std::mutex borrowed_mutex_;
  std::map<std::uintptr_t, std::shared_ptr<CudaStream>> borrowed_;  // by native handle, under borrowed_mutex_
};

}  // namespace

DeviceGuard::DeviceGuard(Stream& stream) {
  if (auto* cuda = dynamic_cast<CudaStream*>(&stream)) enter(cuda->ordinal());
}

std::shared_ptr<void> stream_resource(Stream& stream, const void* key,
                                      const std::function<std::shared_ptr<void>()>& make) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (!cuda) throw std::logic_error("stream_resource: not a CUDA stream");
  return cuda->resource(key, make);
}

std::shared_ptr<void> capture_graph(Stream& stream, const std::function<void()>& issue) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (!cuda) throw std::logic_error("capture_graph: not a CUDA stream");
  const DeviceGuard guard(stream);
  const auto native = static_cast<cudaStream_t>(cuda->native_handle());
  cudaGraph_t graph = nullptr;
  cuda->untimed([&] {
    STOKER_CUDA_CHECK(cudaStreamBeginCapture(native, cudaStreamCaptureModeThreadLocal));
    try {
      issue();
    } catch (...) {
      if (cudaStreamEndCapture(native, &graph) == cudaSuccess && graph) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      throw;
    }
    STOKER_CUDA_CHECK(cudaStreamEndCapture(native, &graph));
  });
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  STOKER_CUDA_CHECK(status);
  return std::shared_ptr<void>(exec, [ordinal = cuda->ordinal()](void* e) {
    try {
      const DeviceGuard guard(ordinal);
      (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));
    } catch (...) {
      log_teardown_failure("a captured graph's destructor");
    }
  });
}

void launch_graph(Stream& stream, void* graph) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (!cuda) throw std::logic_error("launch_graph: not a CUDA stream");
  cuda->timed("graph", 0, [&] {
    const DeviceGuard guard(stream);
    STOKER_CUDA_CHECK(
        cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(cuda->native_handle())));
  });
}

std::shared_ptr<Device> open_cuda_device(int ordinal) { return std::make_shared<CudaDevice>(ordinal); }

}  // namespace detail
}  // namespace stoker::gpu
