#include "stoker/gpu/device.h"

#include <string>

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

}  // namespace stoker::gpu
