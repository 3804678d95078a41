"""Which collective library each device uses, and where it comes from.

The search orders are the user guide's, with the site's libraries (the
CMake options a Spack build passes, recorded in build_info.json) searched
right after the user's own choice of file:

- NCCL: TORCH_MOJO_BACKEND_NCCL_LIB, the site's, an NCCL wheel
  (nvidia-nccl-cu12 / -cu13), libnccl.so.2 on the library path.
- RCCL: TORCH_MOJO_BACKEND_RCCL_LIB, the ROCm whose HIP runtime is
  loaded in this process (a ROCm build of torch: one HIP runtime for
  both), the site's, $ROCM_PATH/lib, /opt/rocm/lib, librccl.so.1 on the
  library path. An RCCL that would bring a second HIP runtime into the
  process (it needs another libamdhip64 than the loaded one) is loaded
  with a warning that names both.
- libfabric: MOJOCCL_LIBFABRIC, the site's, libfabric.so.1 on the library
  path, the Cray install (/opt/cray/libfabric/*).

CPU tensors always use libmojoccl, installed with the package. Accelerator
tensors use the vendor's library, or libmojoccl with TORCH_MOJO_BACKEND_CCL=mojo:
accelerator_setup() says which, for the process group.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import json
import os
import warnings
from dataclasses import asdict, dataclass, field

from torch_mojo import elf
from torch_mojo._paths import mojoccl_path, package_dir


@dataclass
class Lookup:
    library: str  # the file name looked for, e.g. libnccl.so.2
    path: str | None  # what would be loaded; None: not found
    source: str  # where `path` came from, or why nothing was found
    searched: list[str] = field(default_factory=list)  # the places tried, in order
    warning: str | None = None  # what is wrong with loading `path`, though it loads

    def to_dict(self):
        return asdict(self)


@functools.lru_cache(maxsize=None)
def build_info() -> dict:
    """What the build recorded: versions, kernel targets, site libraries."""
    with open(os.path.join(package_dir(), "build_info.json")) as file:
        return json.load(file)


def gpu_kernel_images() -> dict[str, tuple[str, str]]:
    """The GPU kernel as the build installed it, by target (sm_90, gfx942):
    the image (PTX or an AMD code object) and its entry point's name."""
    directory = os.path.join(package_dir(), "lib", "gpu_kernels")
    images = {}
    for entry in sorted(glob.glob(os.path.join(directory, "reduce.*.entry"))):
        stem = entry[: -len(".entry")]
        target = os.path.basename(stem).split(".", 1)[1]
        image = next((stem + suffix for suffix in (".ptx", ".hsaco") if os.path.exists(stem + suffix)), None)
        if image:
            with open(entry) as file:
                images[target] = (image, file.read().strip())
    return images


def on_library_path(soname: str, environ=None) -> str | None:
    """Where the dynamic loader would find `soname`: LD_LIBRARY_PATH (of
    `environ`, this process's by default) first, then the ldconfig cache."""
    environ = os.environ if environ is None else environ
    for directory in filter(None, environ.get("LD_LIBRARY_PATH", "").split(":")):
        candidate = os.path.join(directory, soname)
        if os.path.exists(candidate):
            return candidate
    return elf.in_ldconfig_cache(soname)


def _search(library: str, candidates: list[tuple[str, str | None]]) -> Lookup:
    """The first candidate (description, path) whose file exists. A path the
    user named that does not exist stops the search: it is a mistake to
    report, not to paper over."""
    searched = []
    for description, path in candidates:
        searched.append(description)
        if not path:
            continue
        if os.path.exists(path):
            return Lookup(library, path, description, searched)
        if description.startswith(("TORCH_MOJO_BACKEND_", "MOJOCCL_")):
            return Lookup(library, None, f"{description}={path}: no such file", searched)
    return Lookup(library, None, "not found", searched)


def _nccl_wheels() -> list[str]:
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return [path for root in roots for path in sorted(glob.glob(os.path.join(root, "*", "lib", "libnccl.so.2")))]


def find_nccl() -> Lookup:
    wheels = _nccl_wheels()
    return _search("libnccl.so.2", [
        ("TORCH_MOJO_BACKEND_NCCL_LIB", os.environ.get("TORCH_MOJO_BACKEND_NCCL_LIB")),
        ("the site's NCCL (built with TORCH_MOJO_NCCL_LIBRARY)", build_info()["nccl_library"]),
        ("an NCCL wheel (nvidia-nccl-cu12 or -cu13)", wheels[0] if wheels else None),
        ("the library path", on_library_path("libnccl.so.2")),
    ])


def loaded_hip_runtime() -> str | None:
    """The HIP runtime (libamdhip64.so) this process has loaded, if any:
    RCCL from the same ROCm keeps one HIP runtime in the process."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith("libamdhip64.so"):
                    return path
    except OSError:
        pass
    return None


def rccl_beside(hip_runtime: str) -> str | None:
    """The RCCL of the ROCm a HIP runtime belongs to: beside it (a ROCm
    install's lib/, or torch/lib/ of a ROCm wheel of torch)."""
    directory = os.path.dirname(os.path.realpath(hip_runtime))
    return next((os.path.join(directory, name) for name in ("librccl.so.1", "librccl.so")
                 if os.path.exists(os.path.join(directory, name))), None)


def find_rccl() -> Lookup:
    rocm_path = os.environ.get("ROCM_PATH")
    hip = loaded_hip_runtime()
    lookup = _search("librccl.so.1", [
        ("TORCH_MOJO_BACKEND_RCCL_LIB", os.environ.get("TORCH_MOJO_BACKEND_RCCL_LIB")),
        ("the ROCm whose HIP runtime is loaded", rccl_beside(hip) if hip else None),
        ("the site's RCCL (built with TORCH_MOJO_RCCL_LIBRARY)", build_info()["rccl_library"]),
        ("$ROCM_PATH/lib", os.path.join(rocm_path, "lib", "librccl.so.1") if rocm_path else None),
        ("/opt/rocm/lib", "/opt/rocm/lib/librccl.so.1"),
        ("the library path", on_library_path("librccl.so.1")),
    ])
    second = second_hip_runtime(lookup.path, hip) if hip and lookup.path else None
    if second:
        lookup.warning = (f"{lookup.path} ({lookup.source}) loads another HIP runtime ({second}) than the one this "
                          f"process has loaded ({hip}): two HIP runtimes in one process can crash or hang; unset "
                          "TORCH_MOJO_BACKEND_RCCL_LIB, or load the torch built for that ROCm")
    return lookup


def second_hip_runtime(rccl: str, hip: str) -> str | None:
    """The HIP runtime RCCL would bring into a process that has loaded
    `hip`, where it is another one: RCCL needs a libamdhip64 of another
    soname, which the loader finds elsewhere. RCCL and HIP in different
    directories (a Spack install: one prefix each) share the runtime when
    the sonames match, as the loader reuses what is loaded."""
    needed = next((name for name in elf.dynamic_section(rccl).needed if name.startswith("libamdhip64.so")), None)
    if needed is None or needed == elf.soname(hip):
        return None
    found = elf.resolve_needed(rccl, needed)
    return found if found and os.path.realpath(found) != os.path.realpath(hip) else None


# The file NCCL (libnccl-net) and RCCL (librccl-net) load their network
# plugin from: PREFIX.so; with NCCL_NET_PLUGIN=NAME, NAME itself (a file on
# the library path, or a path), then PREFIX-NAME.so (NCCL's plugin_open.cc,
# which RCCL shares with its own prefix).
NET_PLUGIN_PREFIX = {"nccl": "libnccl-net", "rccl": "librccl-net"}


def find_net_plugin(kind: str, environ=None) -> Lookup:
    """The libfabric (or other) network plugin that `kind`'s library (nccl
    or rccl) would load in `environ` (this process's by default)."""
    environ = os.environ if environ is None else environ
    prefix = NET_PLUGIN_PREFIX[kind]
    named = environ.get("NCCL_NET_PLUGIN")
    if named == "none":
        return Lookup(f"{prefix}.so", None, "NCCL_NET_PLUGIN=none turns plugins off", ["NCCL_NET_PLUGIN"])
    if not named:
        names = [f"{prefix}.so"]
    elif "/" in named or (named.startswith("lib") and named.endswith(".so")):
        names = [named]
    else:
        names = [named, f"{prefix}-{named}.so"]
    return _search(names[-1], [(f"{name}" + ("" if "/" in name else " on the library path"),
                                name if "/" in name else on_library_path(name, environ)) for name in names])


def find_libfabric() -> Lookup:
    cray = sorted(glob.glob("/opt/cray/libfabric/*/lib64/libfabric.so.1"))
    return _search("libfabric.so.1", [
        ("MOJOCCL_LIBFABRIC", os.environ.get("MOJOCCL_LIBFABRIC")),
        ("the site's libfabric (built with TORCH_MOJO_LIBFABRIC_LIBRARY)", build_info()["libfabric_library"]),
        ("the library path", on_library_path("libfabric.so.1")),
        ("the Cray install (/opt/cray/libfabric)", cray[-1] if cray else None),
    ])


def find_mojoccl() -> Lookup:
    return _search("libmojoccl.so", [("installed with torch-mojo", mojoccl_path())])


def accelerator_ccl() -> str:
    """`vendor` or `mojo`: TORCH_MOJO_BACKEND_CCL, else the build's default."""
    return "mojo" if os.environ.get("TORCH_MOJO_BACKEND_CCL") == "mojo" else build_info()["default_ccl"]


def collective_libraries() -> dict[str, Lookup]:
    """The library each kind of device would load."""
    mojo = accelerator_ccl() == "mojo"
    return {
        "cpu": find_mojoccl(),
        "cuda": find_mojoccl() if mojo else find_nccl(),
        "rocm": find_mojoccl() if mojo else find_rccl(),
    }


# What to do when the vendor's library is missing, per vendor. The message
# keeps the guide's words, "no NCCL/RCCL library found", which users search.
_MISSING_ADVICE = {
    "nvidia": "this node's GPUs are NVIDIA: install NCCL with `pip install \"nvidia-nccl-cu12>=2.27\"` "
              "(nvidia-nccl-cu13 needs driver 580 or newer), or set TORCH_MOJO_BACKEND_NCCL_LIB to "
              "the libnccl.so.2 to load",
    "amd": "this node's GPUs are AMD: RCCL (librccl.so.1) comes with ROCm; set ROCM_PATH to your "
           "ROCm install, or TORCH_MOJO_BACKEND_RCCL_LIB to the librccl.so.1 to load",
}


def missing_library_message(vendor: str, lookup: Lookup) -> str:
    where = lookup.source if lookup.source != "not found" else "searched " + ", ".join(lookup.searched)
    return f"no NCCL/RCCL library found ({where}): {_MISSING_ADVICE[vendor]}"


def accelerator_vendor(device_type: str) -> str:
    """nvidia or amd: who made the GPU behind `device_type` (cuda in a CUDA
    or ROCm build of torch, or the mojo device of torch-mojo-backend)."""
    import torch

    if device_type == "cuda":
        return "amd" if torch.version.hip else "nvidia"
    from torch_mojo.distributed import gpu_vendor

    vendor = gpu_vendor()
    if vendor is None:
        raise RuntimeError(f"cannot tell who made the {device_type} device: neither /dev/kfd (AMD) nor "
                           "/dev/nvidiactl (NVIDIA) exists; set TORCH_MOJO_BACKEND_CCL=mojo to use "
                           "torch-mojo's own collectives")
    return vendor


def accelerator_lookup(device_type: str) -> tuple[Lookup, str]:
    """The search for the library of `device_type` tensors, and its kind:
    nccl, rccl or mojoccl."""
    if accelerator_ccl() == "mojo":
        return find_mojoccl(), "mojoccl"
    vendor = accelerator_vendor(device_type)
    return (find_nccl(), "nccl") if vendor == "nvidia" else (find_rccl(), "rccl")


def accelerator_library(device_type: str) -> tuple[str, str]:
    """(path, kind) of the library for `device_type` tensors. Raises
    RuntimeError when the vendor's library is missing, saying what to
    install or set for that vendor."""
    lookup, kind = accelerator_lookup(device_type)
    if lookup.path is None:
        raise RuntimeError(missing_library_message("nvidia" if kind == "nccl" else "amd", lookup))
    if lookup.warning:
        warnings.warn(lookup.warning, RuntimeWarning, stacklevel=2)
    return lookup.path, kind


def with_version(lookup: Lookup) -> dict:
    """The lookup, with the version the library answers when loaded as a
    process group loads it (or why it does not load)."""
    report = lookup.to_dict()
    if lookup.path:
        try:
            from torch_mojo import _C

            report["version"] = _C._library_version(lookup.path, "library")
        except (ImportError, RuntimeError) as error:
            report["load_error"] = str(error)
    return report


# Device types whose tensors the process group can take besides the CPU's:
# cuda (a CUDA or ROCm build of torch) and mojo (torch-mojo-backend's device).
ACCELERATOR_TYPES = ("cuda", "mojo")


def accelerator_type() -> str | None:
    """cuda or mojo: the kind of accelerator this process has, or None on a
    machine, or a torch build, without one. Touches no device."""
    import torch

    accelerator = torch.accelerator.current_accelerator()
    return accelerator.type if accelerator is not None and accelerator.type in ACCELERATOR_TYPES else None


def current_accelerator():
    """This process's accelerator device, at its current index (which
    initialises the device: call it once the GPU is chosen), or None."""
    import torch

    kind = accelerator_type()
    return torch.device(kind, torch.accelerator.current_device_index()) if kind else None
