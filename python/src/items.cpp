// SPDX-License-Identifier: Apache-2.0
// Items in their Python form: samples, crops, and batches whose tensors leave through DLPack
// without a copy.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "binding.h"
#include "stoker/gpu/dlpack.h"

namespace stoker::python {

namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// A capsule a consumer has not taken still owns its tensor. A consumer that takes it renames it
// (DLPack's protocol), and then owns the tensor's release: the capsule must not free it again.
void delete_unused_capsule(PyObject* capsule) noexcept {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);  // a destructor may run while an exception is being raised
  auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (t == nullptr)
    PyErr_WriteUnraisable(capsule);
  else if (t->deleter != nullptr)
    t->deleter(t);
  PyErr_Restore(type, value, trace);
}

// Each export of a Tensor: a DLManagedTensor of its own, which consumers free one by one, over
// the memory of the one tensor to_dlpack made, which the last of them frees.
struct Reexport {
  DLManagedTensor managed{};
  std::shared_ptr<DLManagedTensor> source;  // also owns the shape and strides arrays
};

void delete_reexport(DLManagedTensor* self) noexcept {
  if (self != nullptr) delete static_cast<Reexport*>(self->manager_ctx);
}

// DLPack's stream argument, as the Python array API defines it for CUDA: None means the legacy
// default stream, which is 1; -1 asks for no synchronization; 0 is ambiguous and refused.
constexpr std::intptr_t kLegacyDefaultStream = 1;
constexpr std::intptr_t kNoSynchronization = -1;

void wait_until_ready(Readiness& ready, const py::object& stream) {
  void* event = ready.event->native_handle();
  if (event != nullptr) {  // CUDA: the consumer's stream waits, the host does not
    const std::intptr_t s = stream.is_none() ? kLegacyDefaultStream : stream.cast<std::intptr_t>();
    if (s == kNoSynchronization) return;
    if (s == 0) throw py::value_error("__dlpack__: stream 0 is ambiguous; pass 1 for the legacy default stream");
    stream_wait_event(static_cast<std::uintptr_t>(s), event);
    return;
  }
  // The CPU backend has no stream to hand over: the host waits, once, without the GIL.
  py::gil_scoped_release nogil;
  std::lock_guard lock(ready.mutex);
  if (ready.passed) return;
  ready.event->synchronize();
  ready.passed = true;
}

py::tuple dims_of(const DLTensor& t) {
  py::tuple out(static_cast<std::size_t>(t.ndim));
  for (int i = 0; i < t.ndim; ++i) out[static_cast<std::size_t>(i)] = t.shape[i];
  return out;
}

std::string dtype_of(const DLTensor& t) {
  const std::string bits = std::to_string(t.dtype.bits);
  switch (t.dtype.code) {
    case kDLUInt:
      return "uint" + bits;
    case kDLInt:
      return "int" + bits;
    case kDLFloat:
      return "float" + bits;
    default:
      return "dlpack code " + std::to_string(t.dtype.code) + " bits " + bits;
  }
}

py::dict window_dict(const Window& w) {
  return py::dict(py::arg("z") = w.z, py::arg("y") = w.y, py::arg("x") = w.x, py::arg("depth") = w.depth,
                  py::arg("height") = w.height, py::arg("width") = w.width);
}

py::dict flips_dict(const Flips& f) {
  return py::dict(py::arg("depth") = f.depth, py::arg("height") = f.height, py::arg("width") = f.width);
}

std::uintptr_t address_of(const DLTensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.data) + static_cast<std::uintptr_t>(t.byte_offset);
}

// A sample's tensor: to_dlpack of the shared sample, made anew for every export.
py::object sample_capsule(const std::shared_ptr<Sample>& s) { return dlpack_capsule(to_dlpack(s)); }

py::tuple sample_dims(const std::shared_ptr<Sample>& s) {
  const auto t = own(to_dlpack(s));  // the layout it is exported with
  return dims_of(t->dl_tensor);
}

}  // namespace

// shared_ptr's constructor calls the deleter itself when it cannot allocate its count.
std::shared_ptr<DLManagedTensor> own(DLManagedTensor* t) {
  return {t, [](DLManagedTensor* p) noexcept {
            if (p != nullptr && p->deleter != nullptr) p->deleter(p);
          }};
}

py::object dlpack_capsule(DLManagedTensor* t) {
  PyObject* capsule = PyCapsule_New(t, kCapsuleName, &delete_unused_capsule);
  if (capsule == nullptr) {
    t->deleter(t);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

Tensor::Tensor(std::shared_ptr<DLManagedTensor> tensor, MemoryKind memory, std::shared_ptr<Readiness> ready)
    : tensor_(std::move(tensor)), memory_(memory), ready_(std::move(ready)) {}

py::object Tensor::dlpack(const py::object& stream) const {
  if (ready_) wait_until_ready(*ready_, stream);
  auto e = std::make_unique<Reexport>();
  e->managed.dl_tensor = tensor_->dl_tensor;
  e->managed.manager_ctx = e.get();
  e->managed.deleter = &delete_reexport;
  e->source = tensor_;
  return dlpack_capsule(&e.release()->managed);
}

py::tuple Tensor::dlpack_device() const {
  const DLDevice d = tensor_->dl_tensor.device;
  return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
}

py::object to_python(Sample&& item, const ExportOptions&) {
  return py::cast(std::make_shared<Sample>(std::move(item)));
}

py::object to_python(DeferredCrop&& item, const ExportOptions&) { return py::cast(std::move(item)); }

py::object to_python(EncodedImage&& item, const ExportOptions&) {
  return py::cast(std::make_shared<EncodedImage>(std::move(item)));
}

py::object to_python(DeferredResize&& item, const ExportOptions&) {
  return py::cast(std::make_shared<DeferredResize>(std::move(item)));
}

namespace {

template <class View>
py::object view_of(const DLPackBatch& t, std::size_t count, MemoryKind memory,
                   const std::shared_ptr<Readiness>& ready = nullptr) {
  auto samples = own(t.samples);
  auto labels = own(t.labels);
  View view;
  view.samples = std::make_shared<Tensor>(std::move(samples), memory, ready);
  view.labels = std::make_shared<Tensor>(std::move(labels), memory, ready);
  view.count = count;
  view.memory = memory;
  return py::cast(std::move(view));
}

}  // namespace

py::object to_python(Batch&& item, const ExportOptions& options) {
  const MemoryKind memory = item.storage.pool() ? item.storage.pool()->memory_kind() : MemoryKind::host;
  const std::size_t count = item.count;
  return view_of<BatchView>(to_dlpack(std::move(item), {.labels = options.labels}), count, memory);
}

py::object to_python(gpu::DeviceBatch&& item, const ExportOptions& options) {
  if (options.labels != LabelType::i32)
    throw std::invalid_argument("a device batch's labels are int32 only (they are in device memory)");
  auto ready = std::make_shared<Readiness>();
  ready->event = &item.ready();  // taken before the export, which empties the batch
  const std::size_t count = item.count;
  const DLPackBatch t = to_dlpack(std::move(item));
  const bool on_device = t.samples->dl_tensor.device.device_type == kDLCUDA;
  return view_of<DeviceBatchView>(t, count, on_device ? MemoryKind::device : MemoryKind::host, ready);
}

py::object to_python(Object&& item, const ExportOptions&) { return item.take(); }

// ---------------------------------------------------------------------------------------------
// Option parsing

DType parse_dtype(std::string_view name, const char* option) {
  return parse_choice<DType>(
      name, option,
      {{dtype_name(DType::u8), DType::u8}, {dtype_name(DType::u16), DType::u16}, {dtype_name(DType::f32), DType::f32}});
}

OnError parse_on_error(std::string_view name) {
  return parse_choice<OnError>(name, "on_error", {{"fail", OnError::fail}, {"skip", OnError::skip}});
}

const char* memory_name(MemoryKind m) noexcept {
  switch (m) {
    case MemoryKind::host:
      return "host";
    case MemoryKind::pinned:
      return "pinned";
    case MemoryKind::device:
      return "device";
  }
  return "?";
}

CropSize parse_crop_size(const py::sequence& size, const char* option) {
  std::vector<std::uint32_t> v;
  for (const auto& x : size) v.push_back(x.cast<std::uint32_t>());
  if (v.size() == 2) return {v[0], v[1]};
  if (v.size() == 3) return {v[0], v[1], v[2]};
  throw py::value_error(std::string(option) + " must be (height, width) or (depth, height, width)");
}

std::optional<MirrorOptions> parse_mirror(const py::object& mirror) {
  if (mirror.is_none()) return std::nullopt;
  if (py::isinstance<py::bool_>(mirror)) return mirror.cast<bool>() ? std::optional(MirrorOptions{}) : std::nullopt;
  if (py::isinstance<MirrorOptions>(mirror)) return mirror.cast<MirrorOptions>();
  throw py::type_error("mirror must be None, a bool or a stoker.MirrorOptions");
}

std::optional<Normalization> parse_normalize(const std::optional<Normalizer>& n) {
  return n ? std::optional(n->options()) : std::nullopt;
}

Layout parse_layout(std::string_view name, const char* option) {
  return parse_choice<Layout>(
      name, option,
      {{layout_name(Layout::planar), Layout::planar}, {layout_name(Layout::channels_last), Layout::channels_last}});
}

// ---------------------------------------------------------------------------------------------

void bind_items(py::module_& m) {
  py::class_<Tensor, std::shared_ptr<Tensor>>(m, "Tensor", R"(One tensor of a batch, for any DLPack consumer
(torch.from_dlpack, numpy.from_dlpack), without a copy. Its memory goes back to the
pipeline's pool once this object and every tensor made from it are gone.)")
      .def("__dlpack__", &Tensor::dlpack, py::arg("stream") = py::none(),
           "A DLPack capsule over the same memory; for a device batch the consumer's stream "
           "waits for it first (DLPack's stream convention).")
      .def("__dlpack_device__", &Tensor::dlpack_device)
      .def_property_readonly("shape", [](const Tensor& t) { return dims_of(t.dl()); })
      .def_property_readonly("dtype", [](const Tensor& t) { return dtype_of(t.dl()); })
      .def_property_readonly(
          "data_ptr", [](const Tensor& t) { return address_of(t.dl()); },
          "The address of the first element, as torch.Tensor.data_ptr() gives it.")
      .def_property_readonly(
          "memory", [](const Tensor& t) { return memory_name(t.memory()); },
          "'host', 'pinned' (host memory a device copies from asynchronously; exported as "
          "kDLCPU, so torch.from_dlpack takes it) or 'device'.");

  py::class_<BatchView>(m, "Batch", R"(A collated batch: samples [N, C, (D,) H, W] and labels [N] as
DLPack tensors over the batch's one buffer, which goes back to its pool when the last
Python reference or consumer tensor drops (on whatever thread, without the GIL).)")
      .def_readonly("samples", &BatchView::samples)
      .def_readonly("labels", &BatchView::labels)
      .def_readonly("count", &BatchView::count)
      .def_property_readonly(
          "memory", [](const BatchView& b) { return memory_name(b.memory); },
          "'host', 'pinned' or 'device': where the buffer is. Pinned batches are exported as "
          "host (kDLCPU) memory.")
      .def("__len__", [](const BatchView& b) { return b.count; })
      .def_static(
          "storage_bytes",
          [](const Shape& shape, std::string_view dtype, std::size_t count) {
            return Batch::storage_bytes(shape, parse_dtype(dtype, "dtype"), count);
          },
          py::arg("shape"), py::arg("dtype"), py::arg("count"),
          "Bytes a batch of `count` samples of `shape` takes in its pool: the size of a staging buffer.");

  py::class_<Sample, std::shared_ptr<Sample>>(m, "Sample", R"(An array of up to four dimensions with a label and an id.
A DLPack producer: numpy.from_dlpack(sample) or torch.from_dlpack(sample) view it without
a copy, as [C, (D,) H, W] (or [(D,) H, W, C] when its channels come last).)")
      .def_property_readonly("shape", &sample_dims)
      .def_property_readonly("dtype", [](const Sample& s) { return dtype_name(s.dtype); })
      .def_readonly("label", &Sample::label)
      .def_readonly("id", &Sample::id)
      .def(
          "__dlpack__", [](const std::shared_ptr<Sample>& s, const py::object&) { return sample_capsule(s); },
          py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const Sample&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); });

  py::class_<DeferredCrop>(m, "DeferredCrop", R"(A crop RandomCrops has drawn but not cut: where it lies in its
sample and the axes it reverses. Collate cuts it into its batch.)")
      .def_property_readonly("id", [](const DeferredCrop& c) { return c.crop.id; })
      .def_property_readonly("label", [](const DeferredCrop& c) { return c.source ? c.source->label : 0; })
      .def_property_readonly("window", [](const DeferredCrop& c) { return window_dict(c.crop.window); })
      .def_property_readonly("flips", [](const DeferredCrop& c) { return flips_dict(c.crop.flips); });

  py::class_<EncodedImage, std::shared_ptr<EncodedImage>>(m, "EncodedImage", R"(One image file's bytes as
ImageSource reads them, with its label, id and name (the file, or "shard.tar:member"):
what ImageDecoder and DecodeCropWindow take.)")
      .def_readonly("label", &EncodedImage::label)
      .def_readonly("id", &EncodedImage::id)
      .def_readonly("name", &EncodedImage::name)
      .def("__len__", [](const EncodedImage& e) { return e.data.size(); })
      .def(
          "bytes",
          [](const EncodedImage& e) { return py::bytes(reinterpret_cast<const char*>(e.data.data()), e.data.size()); },
          "A copy of the file's bytes.");

  py::class_<DeferredResize, std::shared_ptr<DeferredResize>>(m, "DeferredResize", R"(A crop DecodeCropWindow
has drawn and whose window it has decoded, not yet resized: Collate resizes it straight into
its batch.)")
      .def_property_readonly("id", [](const DeferredResize& c) { return c.decoded.crop.id; })
      .def_property_readonly("label", [](const DeferredResize& c) { return c.decoded.label; })
      .def_property_readonly(
          "window", [](const DeferredResize& c) { return window_dict(c.decoded.crop.window); },
          "The crop, in the image's full-resolution pixels.")
      .def_property_readonly("flips", [](const DeferredResize& c) { return flips_dict(c.decoded.crop.flips); })
      .def_property_readonly(
          "scale",
          [](const DeferredResize& c) {
            return py::make_tuple(c.decoded.decoded.scale_num, c.decoded.decoded.scale_denom);
          },
          "(num, denom): the scale its window was decoded at.");
}

}  // namespace stoker::python
