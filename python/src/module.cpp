// SPDX-License-Identifier: Apache-2.0
// The compiled half of the Python package `stoker` (python/stoker/): pipelines of stoker's stages
// built and run from Python, their batches handed to PyTorch (or any DLPack or NumPy consumer)
// without a copy. docs/python.md.
#include "binding.h"

PYBIND11_MODULE(_stoker, m) {
  namespace python = stoker::python;
  m.doc() = "stoker: multi-stage input pipelines for training, run in C++, consumed from Python.";
  // The classes belong to the package users import, `stoker` and `stoker.gpu`: their reprs,
  // signatures and errors name them so, as the type stubs do.
  const pybind11::object name = m.attr("__name__");
  m.attr("__name__") = "stoker";
  m.attr("__version__") = STOKER_VERSION;
  pybind11::module_ gpu = m.def_submodule("gpu");
  python::bind_errors(m, gpu);
  python::bind_items(m);
  python::bind_stages(m);
  python::bind_images(m);
  python::bind_gpu(gpu);
  python::bind_pipeline(m);
  m.attr("__name__") = name;
  pybind11::list all;
  for (const auto& [key, value] : m.attr("__dict__").cast<pybind11::dict>()) {
    const auto k = key.cast<std::string>();
    if (!k.empty() && k[0] != '_' && k != "gpu") all.append(key);
  }
  m.attr("__all__") = all;
  pybind11::list gpu_all;
  for (const auto& [key, value] : gpu.attr("__dict__").cast<pybind11::dict>())
    if (key.cast<std::string>()[0] != '_') gpu_all.append(key);
  gpu.attr("__all__") = gpu_all;
}
