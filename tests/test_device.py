"""Collectives on a GPU: NCCL (the default library) with one rank, libmojoccl
(TORCH_MOJO_BACKEND_CCL=mojo) with two ranks sharing the GPU, DDP on the
GPU, and a busbw table. They need a GPU and a CUDA build of torch, so they
skip here; tests/device/run.sh runs them on a machine with one."""

import json
import os
from pathlib import Path

import pytest
import torch

from tests.harness import ROOT, run_torchrun, run_worker
from tests.workers.device import assert_checked

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no GPU here (torch.cuda.is_available() is False); tests/device/run.sh runs these on a GPU machine",
)

MOJO = {"TORCH_MOJO_BACKEND_CCL": "mojo"}


def test_nccl_collectives_with_one_rank():
    results = run_worker("device", 1, "collectives", timeout=300)
    assert_checked(results, "libnccl.so.2", r"nccl version \d{5}")


def test_mojo_collectives_with_two_ranks_on_one_gpu():
    results = run_worker("device", 2, "collectives", env=MOJO, timeout=300)
    assert_checked(results, "libmojoccl.so", "mojoccl version 100")
    assert all("ok send/recv ring" in result.stdout for result in results)


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
    for label, world_size, env in (("nccl", 1, {}), ("mojo", 2, MOJO)):
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
