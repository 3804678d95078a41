"""The GPU kernel, without a GPU: the build compiles it for sm_90 (PTX) and
gfx942 (an AMD code object); NVIDIA's assembler takes the PTX as the driver
would, the code object is an AMD GPU ELF with the kernel in it, and the
kernel's own code, compiled for the CPU, gives bit for bit the CPU kernel's
results for every datatype and operation. tests/test_device.py runs the PTX
on a GPU when there is one."""

import ctypes
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests import gpu_kernel
from tests.harness import ROOT
from torch_mojo import mojoccl
from torch_mojo._paths import library_dir

TARGETS = {"sm_90", "gfx942"}  # the default build: H100/H200, MI300A/X
PTXAS = Path(library_dir()).parents[1] / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"


def test_the_build_compiles_the_kernel_for_each_target_and_records_them():
    recorded = json.loads((Path(library_dir()).parent / "build_info.json").read_text())
    assert set(recorded["gpu_targets"].split(";")) == TARGETS and recorded["max"]
    assert set(gpu_kernel.images()) == TARGETS


def ptx_parameters(ptx: str, entry: str) -> list[int]:
    """Byte size of each parameter of `entry`, from its PTX declaration."""
    declaration = re.search(rf"\.entry {re.escape(entry)}\((.*?)\)", ptx, re.S).group(1)
    sizes = []
    for parameter in declaration.split(","):
        array = re.search(r"\[(\d+)\]", parameter)
        sizes.append(int(array.group(1)) if array else int(re.search(r"\.[bus](\d+)", parameter).group(1)) // 8)
    return sizes


@pytest.mark.skipif(not PTXAS.exists(), reason=f"no ptxas at {PTXAS} (pip install nvidia-cuda-nvcc-cu12)")
def test_ptx_for_sm_90_assembles_without_stack_and_takes_the_launchers_arguments(tmp_path):
    image, entry = gpu_kernel.images()["sm_90"]
    result = subprocess.run([str(PTXAS), "--gpu-name", "sm_90a", "-v", str(image), "-o", str(tmp_path / "k.cubin")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"Compiling entry function '{entry}' for 'sm_90a'" in result.stderr
    # A stack would mean per-thread local memory (the source addresses
    # indexed with a variable): slow, and reserved for every resident thread.
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in result.stderr, result.stderr
    expected = [ctypes.sizeof(value) for value in gpu_kernel.arguments(0, [0], 1, 7, 0)]
    assert ptx_parameters(image.read_text(), entry) == expected


@pytest.mark.skipif(not PTXAS.exists(), reason=f"no ptxas at {PTXAS} (pip install nvidia-cuda-nvcc-cu12)")
def test_the_build_also_assembles_sm_90_machine_code_with_the_kernel():
    """With ptxas at hand the build ships a cubin too, which the driver loads
    without compiling the PTX at the first collective."""
    image, entry = gpu_kernel.images()["sm_90"]
    cubin = image.with_suffix(".cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and int.from_bytes(cubin[18:20], "little") == 190  # EM_CUDA
    assert entry.encode() + b"\0" in cubin


@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf (binutils)")
def test_code_object_for_gfx942_is_an_amd_gpu_elf_with_the_kernel():
    image, entry = gpu_kernel.images()["gfx942"]
    header = image.read_bytes()[:64]
    machine = int.from_bytes(header[18:20], "little")
    flags = int.from_bytes(header[48:52], "little")
    assert header[:4] == b"\x7fELF" and machine == 224  # EM_AMDGPU
    assert flags & 0xFF == 0x4C  # EF_AMDGPU_MACH_AMDGCN_GFX942
    symbols = subprocess.run(["readelf", "-s", "--wide", str(image)], capture_output=True, text=True,
                             check=True).stdout.split()
    assert entry in symbols and f"{entry}.kd" in symbols  # the kernel and its descriptor


DTYPES = {name: code for name, code in mojoccl.DATATYPES.items() if name != "bool"}


def random_sources(dtype: torch.dtype, nsources: int, count: int, generator) -> list[torch.Tensor]:
    sources = []
    for s in range(nsources):
        if dtype.is_floating_point:
            values = torch.randn(count, generator=generator, dtype=torch.float64).to(dtype)
            values[(s * 37) % count] = float("nan")
        else:
            high = min(100, torch.iinfo(dtype).max)
            values = torch.randint(0 if not dtype.is_signed else -high, high, (count,), generator=generator,
                                   dtype=torch.int64).to(dtype)
        sources.append(values)
    return sources


@pytest.fixture(scope="module")
def on_cpu(tmp_path_factory):
    return gpu_kernel.build_on_cpu(tmp_path_factory.mktemp("gpu-kernel-on-cpu"))


def test_the_kernels_code_matches_the_cpu_kernel_bit_for_bit(on_cpu):
    cpu = ctypes.CDLL(str(Path(library_dir()) / "libtorch_mojo_kernels.so"))
    cpu.tm_reduce.restype = ctypes.c_int32
    cpu.tm_reduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_int32, ctypes.c_int32, ctypes.c_int64]
    generator = torch.Generator().manual_seed(7)
    count, threads = 1003, 7  # a count no thread count divides
    checked = 0
    for name, code in DTYPES.items():
        dtype = getattr(torch, name)
        for op in (mojoccl.SUM, mojoccl.PROD, mojoccl.MAX, mojoccl.MIN, mojoccl.AVG):
            for nsources, offset in ((1, 0), (3, 0), (gpu_kernel.MAX_SOURCES, 0), (3, 1)):
                # Offset 1: buffers not 16-byte aligned, read element by element.
                sources = [s[offset:] for s in random_sources(dtype, nsources, count + offset, generator)]
                expected, actual = torch.empty(count, dtype=dtype), torch.empty(count, dtype=dtype)
                table = (ctypes.c_void_p * nsources)(*[s.data_ptr() for s in sources])
                assert cpu.tm_reduce(expected.data_ptr(), table, nsources, count, code, op, nsources) == 0
                values = gpu_kernel.arguments(actual.data_ptr(), [s.data_ptr() for s in sources], count, code, op,
                                              nsources)
                assert on_cpu.tm_gpu_reduce_on_cpu(actual.data_ptr(), values[1], nsources, count, code, op,
                                                   nsources, threads) == 0
                assert torch.equal(actual.view(torch.uint8), expected.view(torch.uint8)), (name, op, nsources, offset)
                checked += 1
    assert checked == len(DTYPES) * 5 * 4


def test_the_kernels_code_reduces_in_place_and_refuses_unknown_codes(on_cpu):
    a, b = torch.arange(10, dtype=torch.float32), torch.full((10,), 0.5)
    values = gpu_kernel.arguments(a.data_ptr(), [a.data_ptr(), b.data_ptr()], 10, 7, mojoccl.SUM)
    assert on_cpu.tm_gpu_reduce_on_cpu(a.data_ptr(), values[1], 2, 10, 7, mojoccl.SUM, 1, 3) == 0
    assert torch.equal(a, torch.arange(10, dtype=torch.float32) + 0.5)
    assert on_cpu.tm_gpu_reduce_on_cpu(a.data_ptr(), values[1], 2, 10, 11, mojoccl.SUM, 1, 3) == 1  # BAD_DTYPE
    assert on_cpu.tm_gpu_reduce_on_cpu(a.data_ptr(), values[1], 2, 10, 7, 9, 1, 3) == 2  # BAD_OP
