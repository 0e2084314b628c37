// SPDX-License-Identifier: Apache-2.0
// The Python module `stoker`: pipelines of stoker's stages built and run from Python, their
// batches handed to PyTorch (or any DLPack consumer) without a copy. docs/python.md.
#include "binding.h"

PYBIND11_MODULE(stoker, m) {
  namespace python = stoker::python;
  m.doc() = "stoker: multi-stage input pipelines for training, run in C++, consumed from Python.";
  m.attr("__version__") = STOKER_VERSION;
  pybind11::module_ gpu = m.def_submodule("gpu");
  python::bind_errors(m, gpu);
  python::bind_items(m);
  python::bind_stages(m);
  python::bind_images(m);
  python::bind_gpu(gpu);
  python::bind_pipeline(m);
}
