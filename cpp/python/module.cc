// torch_mojo._C: the pybind11 face of the process group. Thin on purpose:
// everything it exposes is implemented in cpp/backend.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/process_group_mojo.hpp"

namespace py = pybind11;
using torch_mojo::ProcessGroupMojo;

PYBIND11_MODULE(_C, module) {
  module.doc() = "torch-mojo's C++ core: the `mojo` c10d backend";
  // c10d's Backend must be registered with pybind11 before we derive from it.
  py::module_::import("torch.distributed");

  py::class_<ProcessGroupMojo, c10d::Backend, c10::intrusive_ptr<ProcessGroupMojo>>(
      module, "ProcessGroupMojo")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("library_path", &ProcessGroupMojo::libraryPath)
      .def_property_readonly("library_version", &ProcessGroupMojo::libraryVersion);

  module.attr("BUILT_WITH_TORCH") = TORCH_MOJO_BUILT_WITH_TORCH;
}
