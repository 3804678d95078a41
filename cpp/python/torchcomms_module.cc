// torch_mojo._torchcomms: registers `mojo` with torchcomms' factory. Thin
// on purpose: the backend is cpp/torchcomms, over cpp/backend.
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <comms/torchcomms/TorchCommFactory.hpp>

#include "torchcomms/torch_comm_mojo.h"

namespace py = pybind11;
using torch_mojo::AcceleratorSetup;
using torch_mojo::TorchCommMojo;

PYBIND11_MODULE(_torchcomms, module) {
  module.doc() = "torch-mojo's torchcomms backend `mojo`";
  module.attr("ABI_VERSION") = torch::comms::TORCHCOMM_BACKEND_ABI_VERSION;
  module.attr("BUILT_WITH_TORCHCOMMS") = TORCH_MOJO_BUILT_WITH_TORCHCOMMS;

  // `prepare(device)` -> None, or (library path, library kind) for the
  // device's tensors. Kept for the life of the process: a communicator
  // may be made until the interpreter ends.
  module.def(
      "register",
      [](py::function prepare) {
        auto* held = new py::object(std::move(prepare));  // never freed: see above
        TorchCommMojo::setPreparation([held](const at::Device& device) {
          py::gil_scoped_acquire gil;
          py::object found = (*held)(device);
          std::optional<AcceleratorSetup> setup;
          if (!found.is_none()) {
            auto [path, kind] = found.cast<std::pair<std::string, std::string>>();
            setup = AcceleratorSetup{device, path, kind};
          }
          return setup;
        });
        torch::comms::TorchCommFactory::get().register_backend(
            "mojo", [] { return std::make_shared<TorchCommMojo>(); });
      },
      py::arg("prepare"));
}
