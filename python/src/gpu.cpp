// SPDX-License-Identifier: Apache-2.0
// stoker.gpu: devices (CUDA, or the CPU backend), pinned and device buffer pools, and the stages
// that move batches to a device (ToDevice) and crop them there (GpuAugment).
#include <dlfcn.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "binding.h"
#include "stoker/gpu/augment.h"

namespace stoker::python {

// The binding includes no CUDA header and links no CUDA library. An event has a native handle
// only on the CUDA backend, which has loaded the driver: its entry point is found there. A
// cudaStream_t is a CUstream and a cudaEvent_t a CUevent, and 1 and 2 name the same default
// streams in both APIs.
void stream_wait_event(std::uintptr_t stream, void* event) {
  using WaitEvent = int (*)(void* stream, void* event, unsigned flags);
  static const WaitEvent wait_event = []() -> WaitEvent {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    return driver ? reinterpret_cast<WaitEvent>(dlsym(driver, "cuStreamWaitEvent")) : nullptr;
  }();
  if (wait_event == nullptr)
    throw gpu::DeviceError("__dlpack__: the CUDA driver (libcuda.so.1, cuStreamWaitEvent) is not loaded");
  if (const int status = wait_event(reinterpret_cast<void*>(stream), event, 0); status != 0)
    throw gpu::DeviceError("__dlpack__: cuStreamWaitEvent on the consumer's stream failed with CUresult " +
                           std::to_string(status));
}

void bind_gpu(py::module_& g) {
  g.doc() = "Devices (CUDA, or the CPU backend that emulates one), pinned staging and the device stages.";
  g.def("built_with_cuda", &gpu::built_with_cuda);
  g.def("cuda_device_count", &gpu::cuda_device_count);

  py::class_<gpu::Device, std::shared_ptr<gpu::Device>>(g, "Device", R"(A device: CUDA, or the CPU backend, whose
streams and events are emulated on host threads.)")
      .def_static("open", &gpu::Device::open, py::arg("backend") = "auto",
                  "'auto' (CUDA when a GPU is visible, else the CPU backend), 'cpu', 'cuda' or 'cuda:N'.")
      .def_property_readonly("backend", [](const gpu::Device& d) { return gpu::backend_name(d.backend()); })
      .def_property_readonly("name", &gpu::Device::name)
      .def_property_readonly("ordinal", &gpu::Device::ordinal)
      .def("transfers", [](const gpu::Device& d) {
        const gpu::TransferCounts t = d.transfers();
        return py::dict(py::arg("h2d_copies") = t.h2d_copies, py::arg("h2d_bytes") = t.h2d_bytes,
                        py::arg("d2h_copies") = t.d2h_copies, py::arg("d2h_bytes") = t.d2h_bytes);
      });
  g.def(
      "transfer_counters",
      [](std::shared_ptr<gpu::Device> d) { return Counters{gpu::transfer_counters(std::move(d))}; }, py::arg("device"),
      "The device's copies, for PipelineBuilder.counters().");
  g.def(
      "device_timeline", [](std::shared_ptr<gpu::Device> d) { return Timeline{gpu::device_timeline(std::move(d))}; },
      py::arg("device"), "The device's copies and kernels, for PipelineBuilder.trace() with .timeline().");

  py::class_<gpu::SlotPool, BufferPool, std::shared_ptr<gpu::SlotPool>>(g, "SlotPool", R"(A fixed number of equal
buffers of pinned host memory or of device memory; acquiring waits while all are in use.)")
      .def_static(
          "create",
          [](std::shared_ptr<gpu::Device> device, std::string_view kind, std::size_t slots, std::size_t slot_bytes,
             std::string name, int wait_limit_ms) {
            return gpu::SlotPool::create(
                std::move(device),
                parse_choice<gpu::SlotPool::Kind>(
                    kind, "kind", {{"pinned", gpu::SlotPool::Kind::pinned}, {"device", gpu::SlotPool::Kind::device}}),
                slots, slot_bytes,
                {.name = std::move(name), .sizing = {}, .wait_limit = std::chrono::milliseconds(wait_limit_ms)});
          },
          py::arg("device"), py::arg("kind"), py::arg("slots"), py::arg("slot_bytes"), py::arg("name") = "slot pool",
          py::arg("wait_limit_ms") = 60'000)
      .def("in_use", &gpu::SlotPool::in_use, py::call_guard<py::gil_scoped_release>(),
           "Buffers held, or waiting for the device work on them.")
      .def_property_readonly("slots", &gpu::SlotPool::slots)
      .def_property_readonly("slot_bytes", &gpu::SlotPool::slot_bytes);

  py::class_<gpu::ToDevice>(g, "ToDevice", R"(The host-to-device stage (map, one thread): one asynchronous copy
per batch from a pinned staging buffer (collate into staging()) to a device buffer.)")
      .def(py::init([](std::shared_ptr<gpu::Device> device, std::size_t bytes, std::size_t staging_buffers,
                       std::size_t device_buffers, int wait_limit_ms) {
             return gpu::ToDevice(std::move(device), {.bytes = bytes,
                                                      .staging_buffers = staging_buffers,
                                                      .device_buffers = device_buffers,
                                                      .wait_limit = std::chrono::milliseconds(wait_limit_ms)});
           }),
           py::arg("device"), py::arg("bytes"), py::arg("staging_buffers") = 4u,
           py::arg("device_buffers") = gpu::ToDeviceOptions{}.device_buffers, py::arg("wait_limit_ms") = 60'000)
      .def("staging", &gpu::ToDevice::staging)
      .def("device_pool", &gpu::ToDevice::device_pool);

  py::class_<gpu::GpuAugment>(g, "GpuAugment", R"(Random crops, shuffled and batched on the device (a flat_map
stage, one thread) from batches of whole images collated into staging().)")
      .def(py::init([](std::shared_ptr<gpu::Device> device, const RandomCrops& crops, std::size_t batch_size,
                       const Shape& image, std::size_t max_images, bool drop_remainder, const ShuffleOptions& shuffle,
                       std::string_view dtype, std::size_t staging_buffers, std::size_t output_buffers,
                       int wait_limit_ms) {
             return gpu::GpuAugment(std::move(device), {.crops = crops.options(),
                                                        .batch_size = batch_size,
                                                        .drop_remainder = drop_remainder,
                                                        .shuffle = shuffle,
                                                        .image = image,
                                                        .dtype = parse_dtype(dtype, "dtype"),
                                                        .max_images = max_images,
                                                        .staging_buffers = staging_buffers,
                                                        .output_buffers = output_buffers,
                                                        .wait_limit = std::chrono::milliseconds(wait_limit_ms)});
           }),
           py::arg("device"), py::arg("crops"), py::arg("batch_size"), py::arg("image"), py::arg("max_images"),
           py::arg("drop_remainder") = false, py::arg("shuffle") = ShuffleOptions{}, py::arg("dtype") = "uint8",
           py::arg("staging_buffers") = 3u, py::arg("output_buffers") = 0u, py::arg("wait_limit_ms") = 60'000,
           "crops: a stoker.RandomCrops whose options it draws by (its normalize included).")
      .def("staging", &gpu::GpuAugment::staging);

  py::class_<DeviceBatchView, BatchView>(g, "DeviceBatch", R"(A batch in device memory (host memory on the CPU
backend). Exporting a tensor makes the consumer's CUDA stream wait for the copy or kernels
that filled it (the host does not wait); on the CPU backend the host waits for them.
Release the tensors only once the device work that reads them is done: the buffer is
reused at once.)");
}

}  // namespace stoker::python
