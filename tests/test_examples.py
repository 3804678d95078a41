"""The examples, launched with torchrun as a user would."""

import pytest
import torch

from tests.harness import ROOT, run_torchrun

TRAIN_DDP = str(ROOT / "examples" / "train_ddp.py")


def train(tmp_path, nproc, backend, steps=40):
    save = str(tmp_path / f"{backend}-{nproc}-{{rank}}.pt")
    stdout, stderr = run_torchrun(
        [TRAIN_DDP, "--backend", backend, "--steps", str(steps), "--save", save], nproc, cwd=tmp_path
    )
    states = [torch.load(save.format(rank=rank)) for rank in range(nproc)]
    return stdout, stderr, states


@pytest.mark.parametrize("nproc", [2, 4])
def test_ddp_example_matches_gloo(tmp_path, nproc):
    stdout, stderr, mojo = train(tmp_path, nproc, "mojo")
    assert f"backend mojo, world size {nproc}" in stdout
    assert "step  40  loss" in stdout
    assert stderr.count("[TRACE] collectives via ") == nproc
    for state in mojo[1:]:  # every rank holds the same model
        for name in state:
            assert torch.equal(state[name], mojo[0][name]), name
    _, _, gloo = train(tmp_path, nproc, "gloo")
    for name in gloo[0]:
        torch.testing.assert_close(mojo[0][name], gloo[0][name], rtol=1e-5, atol=1e-6)


def test_ddp_example_default_run_prints_the_loss(tmp_path):
    stdout, _ = run_torchrun([TRAIN_DDP], 2, cwd=tmp_path)
    losses = [float(line.split()[-1]) for line in stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 5 and losses[-1] < losses[0]
    assert (tmp_path / "checkpoint.pt").exists()
