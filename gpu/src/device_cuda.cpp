// The CUDA backend. Every call goes through STOKER_CUDA_CHECK; destructors never throw.
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <string>

#include "stoker/core/pipeline.h"

#include "backends.h"
#include "cuda_check.h"

namespace stoker::gpu {

bool built_with_cuda() noexcept { return true; }

int cuda_device_count() noexcept {
  int count = 0;
  // No driver or no device is an answer here, not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

namespace detail {

TraceRange::TraceRange(const char* name) noexcept { nvtxRangePushA(name); }
TraceRange::~TraceRange() { nvtxRangePop(); }

namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent() { STOKER_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~CudaEvent() override { (void)cudaEventDestroy(event); }
  bool done() override {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    STOKER_CUDA_CHECK(status);
    return true;
  }
  void synchronize() override { STOKER_CUDA_CHECK(cudaEventSynchronize(event)); }
  void* native_handle() noexcept override { return event; }
  cudaEvent_t event{};
};

class CudaStream final : public Stream {
 public:
  explicit CudaStream(DeviceBase& device) : device_(device) {
    // Non-blocking: no implicit ordering with the legacy default stream.
    STOKER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaStream() override {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }

  void copy_to_device(void* dst, const void* src, std::size_t bytes) override {
    STOKER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    device_.counted_h2d(bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    STOKER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    device_.counted_d2h(bytes);
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes) override {
    STOKER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void record(Event& event) override {
    STOKER_CUDA_CHECK(cudaEventRecord(static_cast<CudaEvent&>(event).event, stream_));
  }
  void wait(Event& event) override {
    STOKER_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<CudaEvent&>(event).event, 0));
  }
  void host_task(std::function<void()> fn) override {
    auto* task = new HostTask{std::move(fn), this};
    const cudaError_t status = cudaLaunchHostFunc(stream_, &HostTask::run, task);
    if (status != cudaSuccess) delete task;
    STOKER_CUDA_CHECK(status);
  }
  void synchronize() override {
    STOKER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    check();
  }
  void check() override {
    {
      std::lock_guard lock(mutex_);
      if (!host_failure_.empty()) throw DeviceError(async_failure(host_failure_));
    }
    const cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaErrorNotReady) return;
    STOKER_CUDA_CHECK(status);
  }
  void* native_handle() noexcept override { return stream_; }

 private:
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

  DeviceBase& device_;
  cudaStream_t stream_{};
  std::mutex mutex_;
  std::string host_failure_;
};

class CudaDevice final : public DeviceBase {
 public:
  CudaDevice() {
    STOKER_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp props{};
    STOKER_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
    name_ = std::string(props.name) + " (cuda:0)";
    // Stage bodies as NVTX ranges, next to the copies and kernels in a profile. NVTX calls
    // cost a few nanoseconds when no profiler listens.
    set_body_tracer({[](const char* stage) { nvtxRangePushA(stage); }, [] { nvtxRangePop(); }});
  }
  Backend backend() const noexcept override { return Backend::cuda; }
  std::string name() const override { return name_; }
  std::unique_ptr<Stream> make_stream() override { return std::make_unique<CudaStream>(*this); }
  std::unique_ptr<Event> make_event() override { return std::make_unique<CudaEvent>(); }
  Memory allocate(std::size_t bytes) override {
    void* p = nullptr;
    STOKER_CUDA_CHECK(cudaMalloc(&p, bytes));
    return Memory(p, bytes, [](void* q) noexcept { (void)cudaFree(q); });
  }
  Memory allocate_pinned(std::size_t bytes) override {
    void* p = nullptr;
    STOKER_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    return Memory(p, bytes, [](void* q) noexcept { (void)cudaFreeHost(q); });
  }
  std::size_t free_memory() const override {
    std::size_t free = 0, total = 0;
    STOKER_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }

 private:
  std::string name_;
};

}  // namespace

std::shared_ptr<Device> open_cuda_device() { return std::make_shared<CudaDevice>(); }

}  // namespace detail
}  // namespace stoker::gpu
