// torch_mojo._C: the pybind11 face of the process group. Thin on purpose:
// everything it exposes is implemented in cpp/backend.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/flight_recorder.hpp"
#include "backend/process_group_mojo.hpp"
#include "backend/shared_pool.h"
#include "backend/tensors.h"
#include "backend/watchdog.hpp"

namespace py = pybind11;
using torch_mojo::ProcessGroupMojo;

PYBIND11_MODULE(_C, module) {
  module.doc() = "torch-mojo's C++ core: the `mojo` c10d backend";
  // c10d's Backend must be registered with pybind11 before we derive from it.
  py::module_::import("torch.distributed");

  py::class_<ProcessGroupMojo, c10d::Backend, c10::intrusive_ptr<ProcessGroupMojo>>(
      module, "ProcessGroupMojo")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::vector<uint64_t> globalRanks,
                       std::optional<c10::Device> device, std::string libraryPath,
                       std::string libraryKind, bool groupStore) {
             std::optional<torch_mojo::AcceleratorSetup> accelerator;
             if (device) accelerator = torch_mojo::AcceleratorSetup{*device, libraryPath, libraryKind};
             return c10::make_intrusive<ProcessGroupMojo>(
                 store, rank, size, timeout, std::move(globalRanks), accelerator,
                 groupStore ? torch_mojo::StoreScope::Group : torch_mojo::StoreScope::Job);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("global_ranks") = std::vector<uint64_t>{}, py::arg("device") = std::nullopt,
           py::arg("library_path") = "", py::arg("library_kind") = "",
           // The store is this group's alone (torchft's per quorum): StoreScope::Group.
           py::arg("group_store") = false, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("library_path", &ProcessGroupMojo::libraryPath)
      .def_property_readonly("library_version", &ProcessGroupMojo::libraryVersion)
      .def("failed_ranks", &ProcessGroupMojo::failedRanks)
      .def("turned_away", &ProcessGroupMojo::turnedAway)
      // ProcessGroupNCCL's query, which torch binds for its own class only.
      .def("get_error", &ProcessGroupMojo::getError)
      // torchft rebuilds a group whose peer failed: the failure must reach
      // it as an error, not end the process.
      .def("_raise_errors_in_caller",
           [](ProcessGroupMojo& group) { group.raiseErrorsInCaller("torch_mojo.torchft.ProcessGroupMojo"); });

  module.def(
      "_shared_tensor",
      [](int64_t numel, at::ScalarType dtype) {
        return torch_mojo::sharedTensor(numel, at::TensorOptions().dtype(dtype));
      },
      py::arg("numel"), py::arg("dtype"));
  module.def("_use_pool_for_cpu_tensors", &torch_mojo::usePoolForCpuTensors, py::arg("enable"));
  module.def("_shared_pool_stats", [] {
    auto stats = torch_mojo::SharedPool::forHost()->stats();
    return py::dict(py::arg("reserved_bytes") = stats.reservedBytes,
                    py::arg("allocated_bytes") = stats.allocatedBytes, py::arg("arenas") = stats.arenas);
  });

  // The flight recorder of this backend, and the watchdog's hooks.
  module.def(
      "_dump_trace",
      [](bool includeCollectives, bool includeStackTraces, bool onlyActive) {
        return py::bytes(torch_mojo::flight_recorder::dumpPickle(includeCollectives,
                                                                 includeStackTraces, onlyActive));
      },
      py::arg("includeCollectives") = true, py::arg("includeStackTraces") = true,
      py::arg("onlyActive") = false);
  module.def("_dump_trace_json", &torch_mojo::flight_recorder::dumpJson,
             py::arg("includeCollectives") = true, py::arg("onlyActive") = false);
  module.def("_groups_alive", [] {
    return torch_mojo::flight_recorder::enabled() && torch_mojo::Watchdog::get().anyGroupAlive();
  });
  // The interpreter is ending: the peers learn it before the groups go.
  module.def(
      "_before_exit",
      [] {
        torch_mojo::ProcessGroupMojo::announceExit();
        torch_mojo::Watchdog::get().beforeExit();
      },
      py::call_guard<py::gil_scoped_release>());
  module.def("_watch_for_interrupts", &torch_mojo::watchForInterrupts);
  // Loads a collective library as a process group would, for `torch-mojo
  // info`: its NCCL version code, or the error a process group would raise.
  module.def(
      "_library_version",
      [](const std::string& path, const std::string& kind) {
        return torch_mojo::CclLibrary(path, kind).version();
      },
      py::arg("path"), py::arg("kind"));

  module.attr("BUILT_WITH_TORCH") = TORCH_MOJO_BUILT_WITH_TORCH;
}
