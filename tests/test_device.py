"""Collectives on a GPU: NCCL (the default library) with one rank, libmojoccl
(TORCH_MOJO_BACKEND_CCL=mojo) with two ranks sharing the GPU, through host
buffers and with MOJOCCL_DEVICE_PEERS=1, DDP on the GPU, a busbw table, and
the Mojo GPU kernel the build compiled for sm_90 (loaded by the CUDA
driver, checked against the CPU kernel). They need a GPU and a CUDA build of torch, so they
skip here; tests/device/run.sh runs them on a machine with one."""

import ctypes
import json
import os
from pathlib import Path

import pytest
import torch

from tests import gpu_kernel
from tests.harness import ROOT, run_torchrun, run_worker
from tests.workers.device import assert_checked, median_seconds

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no GPU here (torch.cuda.is_available() is False); tests/device/run.sh runs these on a GPU machine",
)

MOJO = {"TORCH_MOJO_BACKEND_CCL": "mojo"}
PEERS = {"MOJOCCL_DEVICE_PEERS": "1"}


def test_nccl_collectives_with_one_rank():
    results = run_worker("device", 1, "collectives", timeout=300)
    assert_checked(results, "libnccl.so.2", r"nccl version \d{5}")


def test_mojo_collectives_with_two_ranks_on_one_gpu():
    results = run_worker("device", 2, "collectives", env=MOJO, timeout=300)
    assert_checked(results, "libmojoccl.so", "mojoccl version 100")
    assert all("ok send/recv ring" in result.stdout for result in results)


def test_mojo_collectives_on_the_gpu_with_device_peers():
    """MOJOCCL_DEVICE_PEERS=1: the two ranks map each other's GPU buffer; the
    Mojo kernel reduces them, or the driver copies them (no fallback to host
    buffers)."""
    results = run_worker("device", 2, "peers", env={**MOJO, **PEERS}, timeout=300)
    for result in results:
        assert result.stdout.count("ok peers") == 12, result.stdout
        assert "device memory goes through host buffers" not in result.stderr, result.stderr


# Two workers on the one GPU: use_local_rank_gpu() gives each its entry.
SHARED_GPU = {"CUDA_VISIBLE_DEVICES": "0,0"}


@pytest.mark.parametrize("nproc, env", [(1, {}), (2, {**MOJO, **SHARED_GPU})], ids=["nccl", "mojo"])
def test_ddp_trains_on_the_gpu(tmp_path, nproc, env):
    stdout, _ = run_torchrun([str(ROOT / "examples" / "train_ddp.py"), "--steps", "60",
                              "--save", str(tmp_path / "model.pt")], nproc, env=env, cwd=tmp_path, timeout=300)
    assert f"world size {nproc}, device cuda" in stdout
    losses = [float(line.split()[-1]) for line in stdout.splitlines() if line.startswith("step")]
    assert len(losses) >= 2 and losses[-1] < losses[0], stdout


def test_busbw_table():
    """Writes the table to $TORCH_MOJO_DEVICE_RESULTS (or prints it)."""
    rows = []
    for label, world_size, env in (("nccl", 1, {}), ("mojo", 2, MOJO), ("mojo-ipc", 2, {**MOJO, **PEERS})):
        (first, *_) = run_worker("device", world_size, "busbw", env=env, timeout=420)
        rows += [{"library": label, **json.loads(line)} for line in first.stdout.splitlines() if line.startswith("{")]
    assert rows
    lines = [f"{'library':8s} {'ranks':>5s} {'collective':15s} {'bytes':>11s} {'time us':>10s} {'algbw GB/s':>10s} "
             f"{'busbw GB/s':>10s}"]
    lines += [f"{row['library']:8s} {row['ranks']:5d} {row['collective']:15s} {row['bytes']:11d} {row['us']:10.1f} "
              f"{row['algbw_GBps']:10.2f} {row['busbw_GBps']:10.2f}" for row in rows]
    table = "\n".join(lines) + "\n"
    target = os.environ.get("TORCH_MOJO_DEVICE_RESULTS")
    if target:
        Path(target).write_text(table)
    print(table)


def test_the_gpu_kernel_runs_on_the_gpu_as_on_the_cpu():
    """Every datatype and operation, 1, 3 and 16 sources: the kernel's
    results equal the CPU kernel's (NaN where it has NaN); then its
    bandwidth against torch.add. Written to gpu_kernel.txt next to the
    busbw table."""
    from tests.test_gpu_kernels import DTYPES, random_sources
    from torch_mojo import mojoccl
    from torch_mojo._paths import library_dir

    major, minor = torch.cuda.get_device_capability()
    images = gpu_kernel.images()
    if f"sm_{major}{minor}" not in images:
        pytest.skip(f"this GPU is sm_{major}{minor}; the build compiled the kernel for {sorted(images)}")
    image, entry = images[f"sm_{major}{minor}"]
    torch.zeros(1, device="cuda")  # the CUDA runtime makes its context current on this thread
    driver = gpu_kernel.CudaDriver()
    kernel = driver.load(image, entry)
    cpu = ctypes.CDLL(str(Path(library_dir()) / "libtorch_mojo_kernels.so"))
    cpu.tm_reduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_int32, ctypes.c_int32, ctypes.c_int64]
    generator = torch.Generator().manual_seed(3)
    count = (1 << 20) + 3
    stream = torch.cuda.current_stream().cuda_stream
    for name, code in DTYPES.items():
        dtype = getattr(torch, name)
        for op in (mojoccl.SUM, mojoccl.PROD, mojoccl.MAX, mojoccl.MIN, mojoccl.AVG):
            for nsources in (1, 3, gpu_kernel.MAX_SOURCES):
                sources = random_sources(dtype, nsources, count, generator)
                expected = torch.empty(count, dtype=dtype)
                table = (ctypes.c_void_p * nsources)(*[s.data_ptr() for s in sources])
                assert cpu.tm_reduce(expected.data_ptr(), table, nsources, count, code, op, nsources) == 0
                on_gpu = [s.cuda() for s in sources]
                actual = torch.empty(count, dtype=dtype, device="cuda")
                driver.launch(kernel, gpu_kernel.arguments(actual.data_ptr(), [s.data_ptr() for s in on_gpu], count,
                                                           code, op, nsources), count, stream)
                torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True,
                                           msg=f"{name} op {op} with {nsources} sources")

    lines = [f"{'bytes':>11s} {'mojo kernel GB/s':>16s} {'torch.add GB/s':>14s}   (float32 sum of 2, median of 20)"]
    for size in (1 << 20, 1 << 24, 1 << 28):
        a, b, out = (torch.ones(size // 4, device="cuda") for _ in range(3))
        values = gpu_kernel.arguments(out.data_ptr(), [a.data_ptr(), b.data_ptr()], size // 4, 7, mojoccl.SUM)
        mojo = median_seconds(lambda: driver.launch(kernel, values, size // 4, stream, grid_limit=65535), calls=20)
        add = median_seconds(lambda: torch.add(a, b, out=out), calls=20)
        lines.append(f"{size:11d} {3 * size / mojo / 1e9:16.1f} {3 * size / add / 1e9:14.1f}")
    table = "\n".join(lines) + "\n"
    target = os.environ.get("TORCH_MOJO_DEVICE_RESULTS")
    if target:
        (Path(target).parent / "gpu_kernel.txt").write_text(table)
    print(table)
