#include "stoker/gpu/device.h"

#include <atomic>
#include <exception>
#include <string>

#include <spdlog/spdlog.h>

#include "backends.h"

namespace stoker::gpu {

const char* backend_name(Backend b) noexcept { return b == Backend::cuda ? "cuda" : "cpu"; }

std::shared_ptr<Device> Device::open(std::string_view backend) {
  if (backend == "cpu") return detail::open_cpu_device();
  if (backend == "auto") return cuda_device_count() > 0 ? detail::open_cuda_device() : detail::open_cpu_device();
  if (backend == "cuda") {
    if (!built_with_cuda())
      throw std::runtime_error(
          "device 'cuda': this build of stoker has no CUDA backend (configure with STOKER_CUDA=ON)");
    if (cuda_device_count() == 0)
      throw std::runtime_error("device 'cuda': no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)");
    return detail::open_cuda_device();
  }
  throw std::invalid_argument("device '" + std::string(backend) + "': expected auto, cpu or cuda");
}

CounterSource transfer_counters(std::shared_ptr<const Device> device) {
  return [device = std::move(device)] {
    const auto t = device->transfers();
    return std::vector<Counter>{{"h2d_copies", t.h2d_copies},
                                {"h2d_bytes", t.h2d_bytes},
                                {"d2h_copies", t.d2h_copies},
                                {"d2h_bytes", t.d2h_bytes}};
  };
}

TransferCounts Device::transfers() const noexcept {
  return {h2d_copies_.load(), h2d_bytes_.load(), d2h_copies_.load(), d2h_bytes_.load()};
}

void Device::count_h2d(std::size_t bytes) noexcept {
  h2d_copies_.fetch_add(1, std::memory_order_relaxed);
  h2d_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void Device::count_d2h(std::size_t bytes) noexcept {
  d2h_copies_.fetch_add(1, std::memory_order_relaxed);
  d2h_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

namespace detail {

std::string async_failure(const std::string& what) {
  return "device work failed: " + what +
         ". Device work fails after the call that issued it returned, so this is reported by the first check that "
         "followed (by the stage that issued the work, at its next call, or by whoever waits for it); run with "
         "CUDA_LAUNCH_BLOCKING=1 to have each CUDA launch report its own failure";
}

void log_teardown_failure(const char* where) noexcept {
  static std::atomic<bool> logged{false};
  try {
    std::string what = "unknown exception";
    try {
      if (const auto current = std::current_exception()) std::rethrow_exception(current);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    if (!logged.exchange(true))
      spdlog::error("stoker::gpu: {} went on past a failure of device work (later ones are logged at debug level): {}",
                    where, what);
    else
      spdlog::debug("stoker::gpu: {} went on past a failure of device work: {}", where, what);
  } catch (...) {  // no memory to log with: the destructor goes on all the same
  }
}

}  // namespace detail

}  // namespace stoker::gpu
