// SPDX-License-Identifier: Apache-2.0
// What the parts of the Python module share: Python objects that C++ threads may hold, the
// Python form of each item a pipeline carries, and the registration functions of module.cpp.
// Private to python/.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stoker/gpu/device.h"
#include "stoker/gpu/staging.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/decode_crop.h"
#include "stoker/stages/dlpack.h"
#include "stoker/stages/image.h"
#include "stoker/stages/sample.h"
#include "stoker/stages/transforms.h"

namespace stoker::python {

namespace py = pybind11;

/// An argument the binding takes as any Python object and checks itself (naming the option in
/// its errors, never with pybind11's list of overloads), shown in signatures and the type stubs
/// as `Tag::name` says.
template <class Tag>
struct Arg {
  py::object value;
};
struct SizeTag {  ///< parse_crop_size()'s
  static constexpr auto name = py::detail::const_name("Union[int, Sequence[int]]");
};
struct FloatsTag {  ///< a number, or one per channel
  static constexpr auto name = py::detail::const_name("Union[float, Sequence[float]]");
};
using SizeArg = Arg<SizeTag>;
using FloatsArg = Arg<FloatsTag>;

}  // namespace stoker::python

namespace pybind11::detail {
template <class Tag>
struct type_caster<stoker::python::Arg<Tag>> {
  PYBIND11_TYPE_CASTER(stoker::python::Arg<Tag>, Tag::name);
  bool load(handle src, bool) {
    value.value = reinterpret_borrow<object>(src);
    return true;
  }
  static handle cast(const stoker::python::Arg<Tag>& a, return_value_policy, handle) { return a.value.inc_ref(); }
};
}  // namespace pybind11::detail

namespace stoker::python {

/// A strong reference to a Python object that C++ threads may move and destroy: the destructor
/// takes the GIL when there is a reference to drop. Made, and read, with the GIL held. Move-only,
/// so that items moving through a pipeline's queues never touch the reference count.
class Object {
 public:
  Object() = default;
  explicit Object(py::object o) noexcept : p_(o.release().ptr()) {}
  Object(Object&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Object& operator=(Object&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~Object() { reset(); }

  /// A new reference; with the GIL held.
  py::object get() const { return py::reinterpret_borrow<py::object>(p_); }
  /// This reference, leaving the Object empty; with the GIL held.
  py::object take() { return py::reinterpret_steal<py::object>(std::exchange(p_, nullptr)); }

 private:
  void reset() noexcept {
    if (p_ == nullptr) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(std::exchange(p_, nullptr));
  }
  PyObject* p_ = nullptr;
};

/// A Python exception raised by a Python stage function, carried through the pipeline's C++
/// threads: its message is made while the GIL is held, so that what() needs none (the pipeline
/// reads it under its own locks, and logs skipped items with it), and the exception itself goes
/// with it, to be the cause of the StageError raised in the training loop.
class PythonError : public std::runtime_error {
 public:
  PythonError(std::string message, std::shared_ptr<Object> exception)
      : std::runtime_error(std::move(message)), exception_(std::move(exception)) {}
  const std::shared_ptr<Object>& exception() const noexcept { return exception_; }

 private:
  std::shared_ptr<Object> exception_;
};

/// Runs `f()`, which calls Python, with the GIL held; a Python exception becomes a PythonError.
template <class F>
decltype(auto) python_errors(F&& f) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    std::string message =
        py::str(e.type().attr("__name__")).cast<std::string>() + ": " + py::str(e.value()).cast<std::string>();
    // The traceback through the stage function, for the training loop's report.
    if (e.trace()) PyException_SetTraceback(e.value().ptr(), e.trace().ptr());
    auto exception = std::make_shared<Object>(e.value());
    throw PythonError(std::move(message), std::move(exception));
  }
}

// ---------------------------------------------------------------------------------------------
// Items as Python sees them

/// One tensor of a device batch in CUDA memory (stoker.gpu.DeviceTensor), shared by every export
/// of it (__dlpack__ may be called more than once). The memory stays until this object and every
/// tensor exported from it are gone; the last deleter to run returns it, on whatever thread,
/// without the GIL.
class DeviceTensor {
 public:
  DeviceTensor(std::shared_ptr<DLManagedTensor> tensor, gpu::Event* ready, std::shared_ptr<gpu::SlotPool> pool);

  /// A capsule named "dltensor" of a new DLManagedTensor over the same memory. `stream`
  /// (DLPack's convention: None or 1 the legacy default stream, 2 the per-thread one, a
  /// cudaStream_t otherwise, -1 none) waits for the batch first, and the buffer is not reused
  /// before it has passed the point where the batch is released (SlotPool::record_stream).
  py::object dlpack(const py::object& stream) const;
  py::tuple dlpack_device() const;
  /// The CUDA array interface (version 3), after the host waited for the batch.
  py::dict cuda_array_interface() const;
  const DLTensor& dl() const noexcept { return tensor_->dl_tensor; }

 private:
  std::shared_ptr<DLManagedTensor> tensor_;
  gpu::Event* ready_;  // the slot's: valid while the tensor holds the buffer
  std::shared_ptr<gpu::SlotPool> pool_;
};

/// Owns `t`: its deleter runs when the last copy goes (also if this throws).
std::shared_ptr<DLManagedTensor> own(DLManagedTensor* t);
/// A capsule named "dltensor" that owns `t` until a consumer takes it (renaming it).
py::object dlpack_capsule(DLManagedTensor* t);
/// A NumPy array over a tensor in host memory, which it owns (its base): no copy.
py::object host_array(std::shared_ptr<DLManagedTensor> t);
/// NumPy's __array_interface__ of a tensor in host memory.
py::dict array_interface(const DLTensor& t);
py::tuple dims_of(const DLTensor& t);
std::string dtype_of_code(const DLDataType& t);  ///< "float32", "int64", ...

/// A batch handed to Python: its samples and labels (NumPy arrays, or DeviceTensors on CUDA)
/// over its buffer.
struct BatchView {
  py::object samples, labels;
  std::size_t count = 0;
  MemoryKind memory = MemoryKind::host;
  std::shared_ptr<gpu::SlotPool> slots;  // the buffer's pool, when a SlotPool's: record_stream()
  const void* data = nullptr;            // the buffer's start
  virtual ~BatchView() = default;
};
/// A device batch handed to Python (stoker.gpu.DeviceBatch).
struct DeviceBatchView : BatchView {};

/// The stream `stream` names, as record_stream and __dlpack__ take it: a stoker.gpu.Stream, a
/// torch.cuda.Stream (its cuda_stream; 0, its default stream, is the legacy default stream) or
/// a CUDA stream handle in DLPack's numbering (1 legacy, 2 per-thread), borrowed from `device`.
/// A TypeError or ValueError naming `who` for anything else.
std::shared_ptr<gpu::Stream> parse_stream(const py::object& stream, gpu::Device& device, const char* who);

/// How batches are handed to Python.
struct ExportOptions {
  LabelType labels = LabelType::i64;  ///< host batches'; a device batch's are int32
};

/// Items in their Python form, with the GIL held. Batches become BatchView (no copy), samples
/// stoker.Sample, encoded images and decoded crop windows their classes (no copy), lists Python
/// lists, Python items themselves.
py::object to_python(Sample&& item, const ExportOptions& options);
py::object to_python(DeferredCrop&& item, const ExportOptions& options);
py::object to_python(EncodedImage&& item, const ExportOptions& options);
py::object to_python(DeferredResize&& item, const ExportOptions& options);
py::object to_python(Batch&& item, const ExportOptions& options);
py::object to_python(gpu::DeviceBatch&& item, const ExportOptions& options);
py::object to_python(Object&& item, const ExportOptions& options);
template <class T>
py::object to_python(std::vector<T>&& items, const ExportOptions& options) {
  py::list out(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) out[i] = to_python(std::move(items[i]), options);
  return out;
}

/// What PipelineBuilder.counters() and .timeline() take: counters kept outside the graph (a
/// device's copies) and work timed outside it (a device's streams), from stoker.gpu.
struct Counters {
  CounterSource source;
};
struct Timeline {
  std::shared_ptr<TimelineSource> source;
};

// ---------------------------------------------------------------------------------------------
// Option parsing shared by the bindings: each names the option in its error.

/// The value called `name` among `choices`; a ValueError naming the option and the choices
/// otherwise.
template <class E>
E parse_choice(std::string_view name, const char* option,
               std::initializer_list<std::pair<std::string_view, E>> choices) {
  std::string names;
  for (const auto& [n, value] : choices) {
    if (n == name) return value;
    names += (names.empty() ? "'" : ", '") + std::string(n) + "'";
  }
  throw py::value_error(std::string(option) + " must be one of " + names + ", not '" + std::string(name) + "'");
}
DType parse_dtype(std::string_view name, const char* option);  ///< dtype_name()'s: "uint8", ...
OnError parse_on_error(std::string_view name);
const char* memory_name(MemoryKind m) noexcept;  ///< "host", "pinned", "device"
/// An int (a square), (height, width) or (depth, height, width); a TypeError or ValueError
/// naming `option` and the value otherwise.
CropSize parse_crop_size(const py::handle& size, const char* option);
/// "(h, w)" or "(d, h, w)" as Python writes the tuple.
py::tuple size_tuple(const CropSize& s);
/// A repr: `stoker.<name>(<fields>)`, for the binding's classes.
std::string repr_of(const char* name, const std::vector<std::pair<const char*, py::object>>& fields);
/// `mirror=`: None or False for none, True for MirrorOptions' defaults, or a MirrorOptions.
std::optional<MirrorOptions> parse_mirror(const py::object& mirror);
std::optional<Normalization> parse_normalize(const std::optional<Normalizer>& n);
Layout parse_layout(std::string_view name, const char* option);  ///< layout_name()'s

// ---------------------------------------------------------------------------------------------
// Registration, in the order module.cpp calls them.

void bind_errors(py::module_& m, py::module_& gpu);
void bind_items(py::module_& m);
void bind_stages(py::module_& m);
void bind_images(py::module_& m);
void bind_gpu(py::module_& gpu);
void bind_pipeline(py::module_& m);

}  // namespace stoker::python
