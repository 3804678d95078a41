"""What tests/device/run.sh relies on to build on a GPU machine without
Mojo, MAX or libfabric's headers: prepare.sh gathers them here, and CMake
builds libmojoccl with the kernels (CPU and GPU) compiled elsewhere."""

import json
import subprocess
import sys

from tests.harness import ROOT


def test_prepare_gathers_the_kernels_and_libfabric_headers(tmp_path):
    carry = tmp_path / "carry"
    subprocess.run(["bash", str(ROOT / "tests" / "device" / "prepare.sh"), str(carry)], check=True,
                   capture_output=True, timeout=120)
    assert (carry / "libtorch_mojo_kernels.so").stat().st_size > 0
    assert (carry / "include" / "rdma" / "fabric.h").exists()
    assert {path.name for path in (carry / "gpu_kernels").iterdir()} >= {"reduce.sm_90.ptx", "reduce.sm_90.entry"}

    # Configure as run.sh builds there: the kernels given, Mojo not needed.
    build = tmp_path / "build"
    result = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(build), "-DTORCH_MOJO_BUILD_BACKEND=OFF",
         f"-DPython_EXECUTABLE={sys.executable}", "-DMOJO_EXECUTABLE=/nowhere/mojo",
         f"-DTORCH_MOJO_KERNELS_LIBRARY={carry / 'libtorch_mojo_kernels.so'}",
         f"-DTORCH_MOJO_GPU_KERNELS_DIR={carry / 'gpu_kernels'}",
         f"-DLIBFABRIC_INCLUDE_DIR={carry / 'include'}"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = json.loads((build / "build_info.json").read_text())
    assert recorded["mojo"] == "prebuilt" and recorded["max"] == "prebuilt"
    assert set(recorded["gpu_targets"].split(";")) == {"sm_90", "gfx942"}
    assert (build / "gpu_kernels" / "reduce.sm_90.ptx").read_bytes() == \
        (carry / "gpu_kernels" / "reduce.sm_90.ptx").read_bytes()
    assert (build / "libtorch_mojo_kernels.so").read_bytes() == (carry / "libtorch_mojo_kernels.so").read_bytes()
