// SPDX-License-Identifier: Apache-2.0
// Items in their Python form: samples, crops, and batches whose tensors leave through DLPack
// without a copy.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <pybind11/numpy.h>

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

// Each export of a DeviceTensor: a DLManagedTensor of its own, which consumers free one by one,
// over the memory of the one tensor to_dlpack made, which the last of them frees.
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

py::tuple dims_of(const DLTensor& t) {
  py::tuple out(static_cast<std::size_t>(t.ndim));
  for (int i = 0; i < t.ndim; ++i) out[static_cast<std::size_t>(i)] = t.shape[i];
  return out;
}

std::string dtype_of_code(const DLDataType& t) {
  const std::string bits = std::to_string(t.bits);
  switch (t.code) {
    case kDLUInt:
      return "uint" + bits;
    case kDLInt:
      return "int" + bits;
    case kDLFloat:
      return "float" + bits;
    default:
      return "dlpack code " + std::to_string(t.code) + " bits " + bits;
  }
}

// NumPy's name of a DLPack element type.
static std::string numpy_type(const DLDataType& t) {
  const char* kind = t.code == kDLUInt ? "u" : t.code == kDLInt ? "i" : t.code == kDLFloat ? "f" : nullptr;
  if (kind == nullptr || t.lanes != 1 || t.bits % 8 != 0)
    throw std::invalid_argument("no NumPy type for " + dtype_of_code(t));
  return "<" + std::string(kind) + std::to_string(t.bits / 8);
}

// The array interface of a tensor in host memory, owned by `owner`; numpy.asarray keeps `owner`.
py::dict array_interface(const DLTensor& t) {
  py::object strides = py::none();  // C order (a py::tuple made from None would raise)
  if (t.strides != nullptr) {
    py::tuple bytes(static_cast<std::size_t>(t.ndim));
    for (int i = 0; i < t.ndim; ++i) bytes[static_cast<std::size_t>(i)] = t.strides[i] * (t.dtype.bits / 8);
    strides = std::move(bytes);
  }
  return py::dict(py::arg("shape") = dims_of(t), py::arg("typestr") = numpy_type(t.dtype),
                  py::arg("data") = py::make_tuple(address_of(t), false), py::arg("strides") = strides,
                  py::arg("version") = 3);
}

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

py::object host_array(std::shared_ptr<DLManagedTensor> tensor) {
  const DLTensor& t = tensor->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    throw std::logic_error("host_array: the tensor is not in host memory");
  std::vector<py::ssize_t> shape(t.shape, t.shape + t.ndim), strides;
  if (t.strides != nullptr)
    for (int i = 0; i < t.ndim; ++i) strides.push_back(t.strides[i] * (t.dtype.bits / 8));
  void* data = static_cast<std::byte*>(t.data) + t.byte_offset;
  const py::dtype type(numpy_type(t.dtype));
  // The array's base owns the tensor: the buffer goes back when the array and its views do.
  auto held = std::make_unique<std::shared_ptr<DLManagedTensor>>(std::move(tensor));
  py::capsule owner(held.get(), [](void* p) { delete static_cast<std::shared_ptr<DLManagedTensor>*>(p); });
  held.release();  // the capsule's now
  return strides.empty() ? py::array(type, shape, {}, data, owner) : py::array(type, shape, strides, data, owner);
}

DeviceTensor::DeviceTensor(std::shared_ptr<DLManagedTensor> tensor, gpu::Event* ready,
                           std::shared_ptr<gpu::SlotPool> pool)
    : tensor_(std::move(tensor)), ready_(ready), pool_(std::move(pool)) {}

py::object DeviceTensor::dlpack(const py::object& stream) const {
  const std::intptr_t s = stream.is_none() ? kLegacyDefaultStream : stream.cast<std::intptr_t>();
  if (s == 0) throw py::value_error("__dlpack__: stream 0 is ambiguous; pass 1 for the legacy default stream");
  if (s < kNoSynchronization)
    throw py::value_error("__dlpack__: stream " + std::to_string(s) + " is not a CUDA stream (-1 asks for none)");
  if (s != kNoSynchronization) {
    // The consumer's stream waits for the copy or kernels that filled the batch (the host does
    // not), and the buffer is not reused before that stream passes the point of its release.
    const auto consumer = pool_->device()->borrow_stream(static_cast<std::uintptr_t>(s));
    consumer->wait(*ready_);
    pool_->record_stream(tensor_->dl_tensor.data, consumer);
  }
  auto e = std::make_unique<Reexport>();
  e->managed.dl_tensor = tensor_->dl_tensor;
  e->managed.manager_ctx = e.get();
  e->managed.deleter = &delete_reexport;
  e->source = tensor_;
  return dlpack_capsule(&e.release()->managed);
}

py::tuple DeviceTensor::dlpack_device() const {
  const DLDevice d = tensor_->dl_tensor.device;
  return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
}

py::dict DeviceTensor::cuda_array_interface() const {
  {  // The interface has no way to hand the consumer a point to wait for: the host waits.
    py::gil_scoped_release nogil;
    ready_->synchronize();
  }
  // Whatever stream the consumer then reads it on, the release waits for the legacy default
  // stream, as for a non_blocking copy out of a pinned batch.
  pool_->record_stream(tensor_->dl_tensor.data, pool_->device()->borrow_stream(kLegacyDefaultStream));
  py::dict d = array_interface(tensor_->dl_tensor);
  d["stream"] = py::none();  // ready already
  return d;
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

std::shared_ptr<gpu::SlotPool> slot_pool(BufferPool* pool) {
  auto* slots = dynamic_cast<gpu::SlotPool*>(pool);
  return slots ? std::static_pointer_cast<gpu::SlotPool>(slots->shared_from_this()) : nullptr;
}

}  // namespace

py::object to_python(Batch&& item, const ExportOptions& options) {
  BatchView view;
  view.slots = slot_pool(item.storage.pool());
  view.memory = item.storage.pool() ? item.storage.pool()->memory_kind() : MemoryKind::host;
  view.data = item.storage.data();
  view.count = item.count;
  if (view.slots && view.memory == MemoryKind::pinned)
    // What `x.to("cuda", non_blocking=True)` copies on unless the loop chose another stream:
    // the buffer is not reused before the legacy default stream passes its release.
    view.slots->record_stream(view.data, view.slots->device()->borrow_stream(kLegacyDefaultStream));
  const DLPackBatch t = to_dlpack(std::move(item), {.labels = options.labels});
  auto samples = own(t.samples);
  auto labels = own(t.labels);
  view.samples = host_array(std::move(samples));
  view.labels = host_array(std::move(labels));
  return py::cast(std::move(view));
}

py::object to_python(gpu::DeviceBatch&& item, const ExportOptions&) {
  DeviceBatchView view;
  view.slots = std::static_pointer_cast<gpu::SlotPool>(item.pool().shared_from_this());
  view.data = item.data();
  view.count = item.count;
  gpu::Event* ready = &item.ready();  // the slot's: valid while the tensors hold the buffer
  const DLPackBatch t = to_dlpack(std::move(item));
  auto samples = own(t.samples);
  auto labels = own(t.labels);
  if (samples->dl_tensor.device.device_type == kDLCUDA) {
    view.memory = MemoryKind::device;
    view.samples = py::cast(DeviceTensor(std::move(samples), ready, view.slots));
    view.labels = py::cast(DeviceTensor(std::move(labels), ready, view.slots));
  } else {  // the CPU backend: its device memory is host memory, and the host waits for the copy
    {
      py::gil_scoped_release nogil;
      ready->synchronize();
    }
    view.memory = MemoryKind::host;
    view.samples = host_array(std::move(samples));
    view.labels = host_array(std::move(labels));
  }
  return py::cast(std::move(view));
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

CropSize parse_crop_size(const py::handle& size, const char* option) {
  const auto refuse = [&](const char* why) -> CropSize {
    const std::string what = std::string(option) + " must be a whole number (a square), (height, width) or (depth, " +
                             "height, width), " + why + ", not " + py::repr(size).cast<std::string>();
    if (!py::isinstance<py::str>(size) && (py::isinstance<py::int_>(size) || py::isinstance<py::sequence>(size)))
      throw py::value_error(what);
    throw py::type_error(what);
  };
  const auto side = [&](const py::handle& x) -> std::uint32_t {
    if (!py::isinstance<py::int_>(x) || py::isinstance<py::bool_>(x)) refuse("each a whole number");
    const auto v = x.cast<long long>();
    if (v < 1 || v > 1'000'000) refuse("each from 1 to 1,000,000");
    return static_cast<std::uint32_t>(v);
  };
  if (py::isinstance<py::int_>(size) && !py::isinstance<py::bool_>(size)) {
    const std::uint32_t n = side(size);
    return {n, n};
  }
  if (!py::isinstance<py::sequence>(size) || py::isinstance<py::str>(size)) return refuse("of sides above 0");
  const auto seq = py::reinterpret_borrow<py::sequence>(size);
  if (seq.size() == 2) return {side(seq[0]), side(seq[1])};
  if (seq.size() == 3) return {side(seq[0]), side(seq[1]), side(seq[2])};
  return refuse("of sides above 0");
}

py::tuple size_tuple(const CropSize& s) {
  if (s.depth != 0) return py::make_tuple(s.depth, s.height, s.width);
  return py::make_tuple(s.height, s.width);
}

std::string repr_of(const char* name, const std::vector<std::pair<const char*, py::object>>& fields) {
  std::string out = std::string("stoker.") + name + "(";
  for (std::size_t i = 0; i < fields.size(); ++i)
    out += (i ? ", " : "") + std::string(fields[i].first) + "=" + py::repr(fields[i].second).cast<std::string>();
  return out + ")";
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
  py::class_<Counters>(m, "Counters", "Counters kept outside the graph, for PipelineBuilder.counters().")
      .def("__repr__", [](const Counters&) { return std::string("stoker.Counters()"); });
  py::class_<Timeline>(m, "Timeline", "Work timed outside the graph, for PipelineBuilder.timeline().")
      .def("__repr__", [](const Timeline&) { return std::string("stoker.Timeline()"); });

  py::class_<Shape>(m, "Shape", "Channels, depth, height, width of a sample.")
      .def(py::init([](std::uint32_t c, std::uint32_t d, std::uint32_t h, std::uint32_t w, bool volume,
                       bool channels_last) { return Shape{c, d, h, w, volume, channels_last}; }),
           py::arg("channels") = 1u, py::arg("depth") = 1u, py::arg("height") = 1u, py::arg("width") = 1u,
           py::arg("volume") = false, py::arg("channels_last") = false)
      .def_readwrite("channels", &Shape::channels)
      .def_readwrite("depth", &Shape::depth)
      .def_readwrite("height", &Shape::height)
      .def_readwrite("width", &Shape::width)
      .def_readwrite("volume", &Shape::volume)
      .def_readwrite("channels_last", &Shape::channels_last)
      .def("elements", &Shape::elements)
      .def("__eq__", [](const Shape& a, const Shape& b) { return a == b; })
      .def("__repr__", [](const Shape& s) { return "stoker.Shape(" + s.str() + ")"; });

  py::class_<BatchView>(m, "Batch", R"(A collated batch: (images, labels) as it unpacks, `samples`
[N, C, (D,) H, W] (or [N, (D,) H, W, C] channels last) and `labels` [N] over the batch's one
buffer, without a copy: NumPy arrays for host and pinned memory (torch.as_tensor,
torch.from_numpy, torch.from_dlpack and numpy.asarray take them as they are), and
stoker.gpu.DeviceTensor for CUDA memory. The buffer goes back to its pool when the batch, its
arrays and every tensor made of them are gone, on whatever thread.)")
      .def_readonly("samples", &BatchView::samples)
      .def_readonly("labels", &BatchView::labels)
      .def_readonly("count", &BatchView::count, "The samples in the batch.")
      .def_property_readonly(
          "memory", [](const BatchView& b) { return memory_name(b.memory); },
          "'host', 'pinned' or 'device': where the buffer is. Pinned batches are NumPy arrays "
          "(host memory, kDLCPU).")
      .def(
          "__len__", [](const BatchView&) { return 2; }, "2: a batch is (images, labels); count is its samples.")
      .def(
          "__iter__", [](const BatchView& b) { return py::iter(py::make_tuple(b.samples, b.labels)); },
          "images, labels = batch")
      .def(
          "__getitem__",
          [](const BatchView& b, py::ssize_t i) {
            if (i == 0 || i == -2) return b.samples;
            if (i == 1 || i == -1) return b.labels;
            throw py::index_error("Batch index " + std::to_string(i) + " out of range: a batch is (images, labels)");
          },
          py::arg("index"))
      .def(
          "record_stream",
          [](const BatchView& b, const py::object& stream) {
            if (!b.slots)
              throw py::value_error(
                  "Batch.record_stream: this batch's memory is not from a stoker.gpu.SlotPool (pinned staging or "
                  "device buffers): no stream reads it in place");
            b.slots->record_stream(b.data, parse_stream(stream, *b.slots->device(), "Batch.record_stream"));
          },
          py::arg("stream"),
          "As torch.Tensor.record_stream: `stream` (a torch.cuda.Stream, a stoker.gpu.Stream or a "
          "CUDA stream handle) uses the batch's buffer, which is not reused before that stream has "
          "passed the point where the batch is released. For a copy out of a pinned batch on a "
          "stream other than the default one (x.to('cuda', non_blocking=True)), or device work on "
          "another stream than the one given to __dlpack__.")
      .def("__repr__",
           [](const BatchView& b) {
             return "stoker.Batch(count=" + std::to_string(b.count) + ", samples " +
                    py::repr(b.samples.attr("shape")).cast<std::string>() + " " +
                    py::str(b.samples.attr("dtype")).cast<std::string>() + ", labels " +
                    py::str(b.labels.attr("dtype")).cast<std::string>() + ", memory=" + memory_name(b.memory) + ")";
           })
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
      .def("__dlpack_device__", [](const Sample&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); })
      .def_property_readonly(
          "__array_interface__",
          [](const std::shared_ptr<Sample>& s) {
            const auto t = own(to_dlpack(s));  // its layout; the array keeps the Sample, which keeps the memory
            return array_interface(t->dl_tensor);
          },
          "numpy.asarray(sample) views it without a copy.")
      .def("__repr__", [](const Sample& s) {
        return "stoker.Sample(" + s.shape.str() + " " + dtype_name(s.dtype) + ", label=" + std::to_string(s.label) +
               ", id=" + std::to_string(s.id) + ")";
      });

  py::class_<DeferredCrop>(m, "DeferredCrop", R"(A crop RandomCrops has drawn but not cut: where it lies in its
sample and the axes it reverses. Collate cuts it into its batch.)")
      .def_property_readonly("id", [](const DeferredCrop& c) { return c.crop.id; })
      .def_property_readonly("label", [](const DeferredCrop& c) { return c.source ? c.source->label : 0; })
      .def_property_readonly("window", [](const DeferredCrop& c) { return window_dict(c.crop.window); })
      .def_property_readonly("flips", [](const DeferredCrop& c) { return flips_dict(c.crop.flips); })
      .def("__repr__", [](const DeferredCrop& c) {
        const Window& w = c.crop.window;
        return "stoker.DeferredCrop(id=" + std::to_string(c.crop.id) + ", " + std::to_string(w.height) + "x" +
               std::to_string(w.width) + " at (" + std::to_string(w.y) + ", " + std::to_string(w.x) + "))";
      });

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
          "A copy of the file's bytes.")
      .def("__repr__", [](const EncodedImage& e) {
        return "stoker.EncodedImage(" + py::repr(py::str(e.name)).cast<std::string>() + ", " +
               std::to_string(e.data.size()) + " bytes, label=" + std::to_string(e.label) +
               ", id=" + std::to_string(e.id) + ")";
      });

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
          "(num, denom): the scale its window was decoded at.")
      .def("__repr__", [](const DeferredResize& c) {
        const Window& w = c.decoded.crop.window;
        return "stoker.DeferredResize(id=" + std::to_string(c.decoded.crop.id) + ", window " +
               std::to_string(w.height) + "x" + std::to_string(w.width) + ")";
      });
}

}  // namespace stoker::python
