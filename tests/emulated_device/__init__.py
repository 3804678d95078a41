"""An emulated accelerator for the tests, on machines without a GPU.

device.cpp is torch's PrivateUse1 device, named `mojo` (as
torch-mojo-backend's device is), with host memory and asynchronous streams;
nccl_on_streams.cpp is a vendor library for it that, as NCCL does, only
enqueues each call on the stream it is given (the collectives themselves are
libmojoccl's) and chooses and logs its network as NCCL does, with
net_plugin.c as the net plugin it may find (libnccl-net.so, naming its
network as aws-ofi-nccl does); gpu_runtime.cpp, built as the HIP runtime and as the CUDA
driver, answers the calls with which libmojoccl (TORCH_MOJO_BACKEND_CCL=mojo)
moves device memory, maps its peers' and launches the GPU kernel (running
the kernel's own code, compiled for the CPU). Together they run the process group's accelerator path (the
library search, the communicator on the device, stream ordering with
events, Work and future semantics, the jobs in flight) for real, on the
CPU. They are test tools: nothing of them is installed.

build() compiles them once per build directory; a worker process calls
install() before anything else touches torch.distributed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = ROOT / "build" / "emulated-device"


def _stale(target: Path, *sources: Path) -> bool:
    return not target.exists() or any(source.stat().st_mtime > target.stat().st_mtime for source in sources)


def build() -> dict[str, str]:
    """Compiles the device (a torch extension) and its library; returns the
    environment a worker needs to use them."""
    from torch.utils import cpp_extension

    BUILD.mkdir(parents=True, exist_ok=True)
    shim = BUILD / "libnccl_on_streams.so"
    hip = BUILD / "libemulated_hip.so"
    cuda = BUILD / "libemulated_cuda.so"
    for target, source, extra in ((shim, "nccl_on_streams.cpp", []),
                                  (hip, "gpu_runtime.cpp", ["-Wl,-soname,libamdhip64.so.6"]),
                                  (cuda, "gpu_runtime.cpp", ["-DEMULATED_CUDA", "-Wl,-soname,libcuda.so.1"])):
        if _stale(target, HERE / source, HERE / "stream.h"):
            subprocess.run(["c++", "-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden",
                            f"-I{ROOT / 'cpp' / 'ccl' / 'include'}", str(HERE / source), *extra,
                            "-o", str(target), "-ldl", "-lpthread"], check=True)
    plugin = BUILD / "net-plugin" / "libnccl-net.so"
    if _stale(plugin, HERE / "net_plugin.c"):
        plugin.parent.mkdir(exist_ok=True)
        subprocess.run(["cc", "-shared", "-fPIC", "-fvisibility=hidden", str(HERE / "net_plugin.c"), "-o", str(plugin)],
                       check=True)
    kernel_on_cpu = BUILD / "libgpu_kernel_on_cpu.so"
    if _stale(kernel_on_cpu, *(ROOT / "kernels").glob("*.mojo"), ROOT / "tests" / "gpu_kernel" / "on_cpu.mojo"):
        from tests.gpu_kernel import build_on_cpu

        build_on_cpu(BUILD)
    device = cpp_extension.load(
        name="emulated_mojo_device", sources=[str(HERE / "device.cpp")], build_directory=str(BUILD),
        is_python_module=False, extra_cflags=["-O1"], verbose=False)
    from torch_mojo._paths import mojoccl_path

    return {
        "EMULATED_DEVICE_LIBRARY": str(device) if isinstance(device, str) else str(BUILD / "emulated_mojo_device.so"),
        "TORCH_MOJO_BACKEND_NCCL_LIB": str(shim),
        "EMULATED_NCCL_BACKING": mojoccl_path(),
        # Where the stand-in net plugin is: on LD_LIBRARY_PATH, NCCL finds it.
        "EMULATED_NET_PLUGIN_DIR": str(plugin.parent),
        # Loaded by install() only when a test sets EMULATED_HIP=1 or EMULATED_CUDA=1.
        "EMULATED_HIP_RUNTIME": str(hip),
        "EMULATED_CUDA_DRIVER": str(cuda),
        # What the emulated HIP runtime runs for the GPU kernel.
        "EMULATED_GPU_KERNEL_ON_CPU": str(kernel_on_cpu),
        # How the process group tells the vendor of a `mojo` device without
        # device files: the visibility variable a launcher exports.
        "CUDA_VISIBLE_DEVICES": "0",
    }


class _Module:
    """What torch expects of torch.<device> for a PrivateUse1 device."""

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def is_initialized():
        return True

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def _is_in_bad_fork():
        return False

    @staticmethod
    def manual_seed_all(seed):
        pass


def emulated_runtime() -> str | None:
    """The GPU runtime stand-in a test asked for (EMULATED_HIP=1 or
    EMULATED_CUDA=1), if any."""
    if os.environ.get("EMULATED_HIP") == "1":
        return os.environ["EMULATED_HIP_RUNTIME"]
    if os.environ.get("EMULATED_CUDA") == "1":
        return os.environ["EMULATED_CUDA_DRIVER"]
    return None


def install(library: str | None = None) -> None:
    """Makes the emulated device torch's accelerator in this process."""
    import ctypes

    import torch

    torch.ops.load_library(library or os.environ["EMULATED_DEVICE_LIBRARY"])
    runtime = emulated_runtime()
    if runtime:
        ctypes.CDLL(runtime, mode=ctypes.RTLD_GLOBAL)
    torch.utils.rename_privateuse1_backend("mojo")
    torch._register_device_module("mojo", _Module)

    class Hooks(torch._C._acc.PrivateUse1Hooks):
        def is_available(self):
            return True

        def has_primary_context(self, device_index):
            return True

        def is_built(self):
            return True

    install.hooks = Hooks()  # kept alive: torch holds only a reference
    torch._C._acc.register_python_privateuseone_hook(install.hooks)
    torch.utils.generate_methods_for_privateuse1_backend()
