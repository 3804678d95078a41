"""The GPU kernel (kernels/gpu_reduce.mojo) as the tests use it: its images
in the installed package, its arguments as the launcher passes them, its
own code compiled for the CPU, and a launch through the CUDA driver (on a
machine with an NVIDIA GPU)."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

from tests.harness import ROOT

MAX_SOURCES = 16  # kernels/gpu_reduce.mojo
BLOCK = 256


def images() -> dict[str, tuple[Path, str]]:
    """{target: (image, entry point)} as the build installed them."""
    from torch_mojo.libraries import gpu_kernel_images

    return {target: (Path(image), entry) for target, (image, entry) in gpu_kernel_images().items()}


def arguments(dst: int, sources: list[int], count: int, dtype: int, op: int, divisor: int = 1) -> list:
    """The kernel's parameters in order, each a ctypes value of its size."""
    addresses = (ctypes.c_uint64 * MAX_SOURCES)(*sources)
    return [ctypes.c_void_p(dst), addresses, ctypes.c_int32(len(sources)), ctypes.c_int64(count),
            ctypes.c_int32(dtype), ctypes.c_int32(op), ctypes.c_int64(divisor)]


def build_on_cpu(directory: Path) -> ctypes.CDLL:
    """tests/gpu_kernel/on_cpu.mojo: the kernel's own code, for the CPU."""
    library = directory / "libgpu_kernel_on_cpu.so"
    mojo = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "mojo"
    subprocess.run([str(mojo), "build", "--emit", "shared-lib", "-I", str(ROOT / "kernels"), "-o", str(library),
                    str(ROOT / "tests" / "gpu_kernel" / "on_cpu.mojo")],
                   check=True, capture_output=True, env={**os.environ, "XDG_CACHE_HOME": str(directory / "cache")},
                   timeout=300)
    cdll = ctypes.CDLL(str(library))
    cdll.tm_gpu_reduce_on_cpu.restype = ctypes.c_int32
    cdll.tm_gpu_reduce_on_cpu.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                                          ctypes.c_int32, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64]
    return cdll


class CudaDriver:
    """Loads an image with the CUDA driver and launches its kernel on a
    stream: what a GPU does with the PTX the build made."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, result: int, what: str):
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(result, ctypes.byref(text))
            raise RuntimeError(f"{what}: CUDA error {result} ({text.value.decode() if text.value else '?'})")

    def load(self, image: Path, entry: str) -> ctypes.c_void_p:
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        data = image.read_bytes() + b"\0"
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), data), f"loading {image.name}")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(function), module, entry.encode()), entry)
        return function

    def launch(self, function: ctypes.c_void_p, values: list, count: int, stream: int, grid_limit: int = 1024):
        grid = max(1, min(grid_limit, -(-count // BLOCK)))
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        self.check(self.lib.cuLaunchKernel(function, grid, 1, 1, BLOCK, 1, 1, 0, ctypes.c_void_p(stream),
                                           pointers, None), "launching the kernel")
