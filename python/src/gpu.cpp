// SPDX-License-Identifier: Apache-2.0
// stoker.gpu: devices (CUDA, or the CPU backend), pinned and device buffer pools, and the stages
// that move batches to a device (ToDevice) and crop them there (GpuAugment).
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "binding.h"
#include "stoker/gpu/augment.h"

namespace stoker::python {

namespace {

// A stream for Python: stoker.gpu.Stream, one of a device's own (Device.make_stream()).
struct PythonStream {
  std::shared_ptr<gpu::Stream> stream;
  std::string device;
};

}  // namespace

std::shared_ptr<gpu::Stream> parse_stream(const py::object& stream, gpu::Device& device, const char* who) {
  if (py::isinstance<PythonStream>(stream)) return stream.cast<const PythonStream&>().stream;
  py::object handle = stream;
  bool torch_stream = false;
  if (py::hasattr(stream, "cuda_stream")) {  // torch.cuda.Stream
    handle = stream.attr("cuda_stream");
    torch_stream = true;
  }
  if (!py::isinstance<py::int_>(handle) || py::isinstance<py::bool_>(handle))
    throw py::type_error(std::string(who) +
                         ": stream must be a torch.cuda.Stream, a stoker.gpu.Stream or a CUDA stream handle (an int), "
                         "not " +
                         py::repr(stream).cast<std::string>());
  auto native = handle.cast<std::uintptr_t>();
  if (torch_stream && native == 0) native = 1;  // PyTorch's default stream is CUDA's legacy default stream
  try {
    return device.borrow_stream(native);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(std::string(who) + ": " + e.what());
  }
}

void bind_gpu(py::module_& g) {
  g.doc() = "Devices (CUDA, or the CPU backend that emulates one), pinned staging and the device stages.";
  g.def("built_with_cuda", &gpu::built_with_cuda);
  g.def("cuda_device_count", &gpu::cuda_device_count);

  py::class_<PythonStream>(g, "Stream", R"(A device's stream (Device.make_stream()): an in-order queue of
device work, which a batch's buffer can be told to wait for (Batch.record_stream).)")
      .def(
          "host_task",
          [](PythonStream& s, py::function fn) {
            // Copies of the task share the one reference; the last drops it with the GIL.
            auto held = std::make_shared<Object>(std::move(fn));
            s.stream->host_task([held] {
              py::gil_scoped_acquire gil;
              python_errors([&] { held->get()(); });
            });
          },
          py::arg("fn"), "Calls fn() on a host thread once the work issued before it is done; later work waits.")
      .def(
          "synchronize", [](PythonStream& s) { s.stream->synchronize(); }, py::call_guard<py::gil_scoped_release>(),
          "Waits for everything issued so far; raises the failure of a host task or of device work.")
      .def_property_readonly(
          "native_handle",
          [](PythonStream& s) -> py::object {
            void* h = s.stream->native_handle();
            return h ? py::object(py::int_(reinterpret_cast<std::uintptr_t>(h))) : py::none();
          },
          "The cudaStream_t, or None on the CPU backend.")
      .def("__repr__", [](const PythonStream& s) { return "stoker.gpu.Stream(" + s.device + ")"; });

  py::class_<gpu::Device, std::shared_ptr<gpu::Device>>(g, "Device", R"(A device: CUDA, or the CPU backend, whose
streams and events are emulated on host threads.)")
      .def_static("open", &gpu::Device::open, py::arg("backend") = "auto",
                  "'auto' (CUDA when a GPU is visible, else the CPU backend), 'cpu', 'cpu:sticky' (the CPU backend "
                  "that stops on a fault as a GPU does), 'cuda' or 'cuda:N'.")
      .def(
          "make_stream",
          [](gpu::Device& d) {
            return PythonStream{d.make_stream(), d.name()};
          },
          "A stream of the device's own: an in-order queue of device work (on the CPU backend, a "
          "worker thread).")
      .def("__repr__", [](const gpu::Device& d) { return "stoker.gpu.Device(" + d.name() + ")"; })
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
      .def_property_readonly("slot_bytes", &gpu::SlotPool::slot_bytes)
      .def("__repr__", [](const gpu::SlotPool& p) {
        return "stoker.gpu.SlotPool('" + p.options().name + "', " + memory_name(p.memory_kind()) + ", " +
               std::to_string(p.slots()) + " x " + std::to_string(p.slot_bytes()) + " bytes)";
      });

  py::class_<DeviceTensor>(g, "DeviceTensor", R"(One tensor of a batch in CUDA memory, for any DLPack consumer
(torch.from_dlpack, cupy.from_dlpack) or CUDA array interface consumer (torch.as_tensor),
without a copy. __dlpack__(stream=s) makes the consumer's stream wait for the copy or kernels
that filled the batch (the host does not) and keeps the buffer from reuse until that stream has
passed the point where the batch is released: PyTorch's record_stream, done for it.)")
      .def("__dlpack__", &DeviceTensor::dlpack, py::arg("stream") = py::none())
      .def("__dlpack_device__", &DeviceTensor::dlpack_device)
      .def_property_readonly("__cuda_array_interface__", &DeviceTensor::cuda_array_interface,
                             "Version 3, after the host waited for the batch; the release waits for the "
                             "legacy default stream.")
      .def("__array__",
           [](const DeviceTensor&, const py::args&, const py::kwargs&) -> py::object {
             throw py::type_error(
                 "stoker.gpu.DeviceTensor is in CUDA memory: NumPy cannot view it (torch.from_dlpack does)");
           })
      .def_property_readonly("shape", [](const DeviceTensor& t) { return dims_of(t.dl()); })
      .def_property_readonly("dtype", [](const DeviceTensor& t) { return dtype_of_code(t.dl().dtype); })
      .def_property_readonly(
          "data_ptr",
          [](const DeviceTensor& t) {
            return reinterpret_cast<std::uintptr_t>(t.dl().data) + static_cast<std::uintptr_t>(t.dl().byte_offset);
          },
          "The address of the first element, as torch.Tensor.data_ptr() gives it.")
      .def("__repr__", [](const DeviceTensor& t) {
        return "stoker.gpu.DeviceTensor(" + py::repr(dims_of(t.dl())).cast<std::string>() + " " +
               dtype_of_code(t.dl().dtype) + ", cuda:" + std::to_string(t.dl().device.device_id) + ")";
      });

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
      .def("device_pool", &gpu::ToDevice::device_pool)
      .def("__repr__", [](const gpu::ToDevice& t) {
        return "stoker.gpu.ToDevice(" + t.device().name() + ", " + std::to_string(t.staging()->slots()) +
               " staging and " + std::to_string(t.device_pool()->slots()) + " device buffers of " +
               std::to_string(t.staging()->slot_bytes()) + " bytes)";
      });

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
      .def("staging", &gpu::GpuAugment::staging)
      .def("__repr__", [](const gpu::GpuAugment& a) {
        return "stoker.gpu.GpuAugment(batch_size=" + std::to_string(a.options().batch_size) + ")";
      });

  py::class_<DeviceBatchView, BatchView>(g, "DeviceBatch", R"(A batch in device memory: its samples and labels
stoker.gpu.DeviceTensor on CUDA, whose export makes the consumer's stream wait for the copy or
kernels that filled them and keeps the buffer until that stream has passed their release; on the
CPU backend, NumPy arrays of its host memory, once the host waited for the copy. Labels int32.)")
      .def("__repr__", [](const DeviceBatchView& b) {
        return "stoker.gpu.DeviceBatch(count=" + std::to_string(b.count) + ", samples " +
               py::repr(b.samples.attr("shape")).cast<std::string>() + ", memory=" + memory_name(b.memory) + ")";
      });
}

}  // namespace stoker::python
