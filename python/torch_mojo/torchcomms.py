"""The `mojo` backend of torchcomms, torch's second front door.

torchcomms loads torch_mojo._torchcomms_entry, the entry point `mojo` of
the group `torchcomms.backends` (pyproject.toml), the first time a
communicator of that name is asked for: `torchcomms.new_comm("mojo",
device, ...)`, or `init_process_group("mojo")` with
TORCH_DISTRIBUTED_USE_TORCHCOMMS=1. That calls register(), which hands
torchcomms torch_mojo._torchcomms' TorchCommMojo: a communicator that
drives the same process group as the c10d path.
"""

import importlib.metadata

BACKEND_NAME = "mojo"
ENTRY_POINT = "torch_mojo._torchcomms_entry"


def status() -> dict:
    """What `torch-mojo info` and the doctor say of torchcomms: installed
    or not, the switch, and whether `mojo` is built and registered."""
    import os

    report = {
        "installed": None,
        "switch": os.environ.get("TORCH_DISTRIBUTED_USE_TORCHCOMMS", ""),
        "backend_built_with": None,
        "entry_point": any(
            ep.value == ENTRY_POINT
            for ep in importlib.metadata.entry_points(group="torchcomms.backends", name=BACKEND_NAME)
        ),
        "problem": None,
    }
    try:
        report["installed"] = importlib.metadata.version("torchcomms")
    except importlib.metadata.PackageNotFoundError:
        pass
    from torch_mojo.libraries import build_info

    # What the build recorded, without loading the module (which needs
    # torchcomms' library loaded first).
    report["backend_built_with"] = build_info().get("torchcomms") or None
    report["problem"] = _problem(report["installed"], report["backend_built_with"])
    return report


def status_line(status: dict) -> str:
    """status(), in one line (torch-mojo info and the doctor)."""
    switch = "on" if status["switch"] == "1" else "off"
    if status["installed"] is None:
        return (f"torchcomms: not installed (TORCH_DISTRIBUTED_USE_TORCHCOMMS {switch}: "
                "torch takes the c10d path)")
    backend = (f"backend mojo built against {status['backend_built_with']}" if status["backend_built_with"]
               else "backend mojo not built")
    registered = "registered" if status["entry_point"] else "NOT registered (reinstall torch-mojo)"
    line = (f"torchcomms {status['installed']}: {backend}, entry point {registered}; "
            f"TORCH_DISTRIBUTED_USE_TORCHCOMMS {switch}")
    return line + (f"\n  PROBLEM: {status['problem']}" if status["problem"] else "")


def _problem(installed: str | None, built_with: str | None) -> str | None:
    if installed is None:
        return None  # torch keeps the c10d path: nothing to say
    if built_with is None:
        return (
            f"torchcomms {installed} is installed, but torch-mojo was built without its torchcomms "
            "backend (torchcomms' headers were not found at build time): rebuild torch-mojo with "
            "TORCH_MOJO_TORCHCOMMS_SOURCE=<torchcomms source tree> (docs/install.md#torchcomms), "
            "or unset TORCH_DISTRIBUTED_USE_TORCHCOMMS to train through c10d"
        )
    if built_with != installed:
        return (
            f"torch-mojo's torchcomms backend was built against torchcomms {built_with}, but this "
            f"environment has torchcomms {installed}: a backend's C++ ABI follows torchcomms' "
            "version, so rebuild torch-mojo against this one (docs/install.md#torchcomms), or "
            "unset TORCH_DISTRIBUTED_USE_TORCHCOMMS to train through c10d"
        )
    return None


def _prepare(device):
    """Before each communicator: what the c10d path decides in Python."""
    from torch_mojo import _registration, libraries

    _registration._follow_torch_determinism()
    if device.type == "cpu":
        return None
    return libraries.accelerator_library(device.type)


def register():
    """Registers `mojo` with torchcomms, or raises ImportError saying why
    it cannot be (torchcomms turns that into its own error on every rank)."""
    # torchcomms first: it loads libtorchcomms.so, which _torchcomms links.
    import torchcomms  # noqa: F401

    problem = status()["problem"]
    if problem:
        raise ImportError(problem)
    from torch_mojo import _torchcomms

    _torchcomms.register(_prepare)
