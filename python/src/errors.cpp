// SPDX-License-Identifier: Apache-2.0
// stoker's C++ errors as Python exceptions: StageError naming the stage (its cause, the stage's
// own exception, chained as __cause__), DataError naming the file, StateError, and the device's.
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "binding.h"
#include "stoker/core/stage_error.h"
#include "stoker/core/state.h"
#include "stoker/stages/reader.h"

namespace stoker::python {

namespace {

// The classes, registered once; they live as long as the module.
struct Classes {
  py::handle stage, data, state, device, pool_timeout;
};
Classes& classes() {
  static Classes c;
  return c;
}

// C++ messages quote file names and file contents, which need not be UTF-8: bytes that are not
// show as \xNN escapes rather than failing the error itself with a UnicodeDecodeError.
py::str text(const char* message) {
  PyObject* s = PyUnicode_DecodeUTF8(message, static_cast<Py_ssize_t>(std::strlen(message)), "backslashreplace");
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

py::object make(py::handle type, const char* message) { return type(text(message)); }

// A Python exception object for the C++ exception `e`, cause included.
py::object as_python(std::exception_ptr e);

py::object stage_error(const StageError& e) {
  py::object exc = make(classes().stage, e.what());
  exc.attr("stage") = e.stage();
  if (e.original()) {
    py::object cause = as_python(e.original());
    PyException_SetCause(exc.ptr(), cause.release().ptr());  // steals; also sets __suppress_context__
  }
  return exc;
}

py::object as_python(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const PythonError& x) {
    return x.exception()->get();  // what the Python stage raised, with its traceback
  } catch (const StageError& x) {
    return stage_error(x);
  } catch (const DataError& x) {
    py::object exc = make(classes().data, x.what());
    exc.attr("file") = text(x.file().c_str());
    return exc;
  } catch (const StateError& x) {
    return make(classes().state, x.what());
  } catch (const gpu::PoolTimeout& x) {
    return make(classes().pool_timeout, x.what());
  } catch (const gpu::DeviceError& x) {
    return make(classes().device, x.what());
  } catch (const std::invalid_argument& x) {
    return make(PyExc_ValueError, x.what());
  } catch (const std::out_of_range& x) {
    return make(PyExc_IndexError, x.what());
  } catch (const std::bad_alloc& x) {
    return make(PyExc_MemoryError, x.what());
  } catch (const std::exception& x) {
    return make(PyExc_RuntimeError, x.what());
  } catch (...) {
    return make(PyExc_RuntimeError, "unknown C++ exception");
  }
}

void raise(const py::object& exc) { PyErr_SetObject(py::type::handle_of(exc).ptr(), exc.ptr()); }

}  // namespace

void bind_errors(py::module_& m, py::module_& gpu) {
  Classes& c = classes();
  c.stage = py::register_exception<StageError>(m, "StageError", PyExc_RuntimeError);
  c.data = py::register_exception<DataError>(m, "DataError", PyExc_RuntimeError);
  c.state = py::register_exception<StateError>(m, "StateError", PyExc_ValueError);
  c.device = py::register_exception<gpu::DeviceError>(gpu, "DeviceError", PyExc_RuntimeError);
  c.pool_timeout = py::register_exception<gpu::PoolTimeout>(gpu, "PoolTimeout", c.device.ptr());
  m.attr("StageError").attr("__doc__") =
      "A stage failed. stage: its name; __cause__: what it raised (a stoker.DataError naming "
      "the file, or the Python stage's own exception).";
  m.attr("DataError").attr("__doc__") = "Bad input data. file: the file; the message says what is wrong.";
  // What the translator below sets on them, for the type stubs.
  m.attr("StageError").attr("__annotations__") = py::dict(py::arg("stage") = "str");
  m.attr("DataError").attr("__annotations__") = py::dict(py::arg("file") = "str");

  // Tried before register_exception's own translators and pybind11's: every C++ exception of
  // stoker's becomes its Python class with its attributes, and a message that is not UTF-8 is
  // escaped. pybind11's own exceptions (py::value_error, ...) go on to its translator.
  py::register_exception_translator([](std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const py::builtin_exception&) {
      throw;
    } catch (const PythonError& x) {  // a Python source's error outside a pipeline's run
      raise(x.exception()->get());
    } catch (const std::exception&) {
      raise(as_python(e));
    }
  });
}

}  // namespace stoker::python
