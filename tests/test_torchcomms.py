"""torch's second front door: `mojo` as a torchcomms backend.

The marked tests need torchcomms built and installed, and torch-mojo built
against it: `make torchcomms-check` does both (scripts/build-torchcomms.sh)
and runs them. The unmarked ones run in `make test` without torchcomms.
"""

import importlib.util
import re

import pytest

from tests.harness import ROOT, run_torchrun, run_worker

EXAMPLES = ROOT / "examples"
SWITCH = {"TORCH_DISTRIBUTED_USE_TORCHCOMMS": "1"}
# What torch logs on every rank when it takes the torchcomms path.
TORCH_TAKES_TORCHCOMMS = "Using TorchComms backend"

needs_torchcomms = pytest.mark.skipif(
    importlib.util.find_spec("torchcomms") is None
    or importlib.util.find_spec("torch_mojo._torchcomms") is None,
    reason="torchcomms and torch-mojo's backend for it are not built here (make torchcomms-check)",
)


def losses(stdout):
    return re.findall(r"step +\d+ +loss ([0-9.]+)", stdout)


# ------------------------------------------------- without torchcomms


def test_a_torchcomms_of_another_version_is_refused_naming_both():
    from torch_mojo.torchcomms import _problem

    message = _problem(installed="0.4.0", built_with="0.3.0")
    assert "built against torchcomms 0.3.0" in message and "has torchcomms 0.4.0" in message
    assert "TORCH_DISTRIBUTED_USE_TORCHCOMMS" in message
    assert _problem(installed="0.3.0", built_with="0.3.0") is None
    assert _problem(installed=None, built_with=None) is None  # torch keeps c10d: nothing to say
    assert "TORCH_MOJO_TORCHCOMMS_SOURCE" in _problem(installed="0.3.0", built_with=None)


def test_info_says_what_torchcomms_would_do():
    from torch_mojo.cli import torchcomms_line

    assert torchcomms_line({"installed": None, "switch": "1"}) == (
        "torchcomms: not installed (TORCH_DISTRIBUTED_USE_TORCHCOMMS on: torch takes the c10d path)")
    line = torchcomms_line({"installed": "0.3.0", "switch": "", "backend_built_with": "0.3.0",
                            "entry_point": True, "problem": None})
    assert line == ("torchcomms 0.3.0: backend mojo built against 0.3.0, entry point registered; "
                    "TORCH_DISTRIBUTED_USE_TORCHCOMMS off")


def test_the_switch_without_torchcomms_keeps_the_c10d_path(tmp_path):
    if importlib.util.find_spec("torchcomms") is not None:
        pytest.skip("torchcomms is installed here: the switch takes effect")
    stdout, stderr = run_torchrun([str(EXAMPLES / "train_ddp.py"), "--steps", "20"], 2, env=SWITCH,
                                  cwd=tmp_path)
    assert TORCH_TAKES_TORCHCOMMS not in stderr and len(losses(stdout)) == 1


# ---------------------------------------------------- with torchcomms


@pytest.mark.torchcomms
@needs_torchcomms
def test_the_demo_trains_through_torchcomms_with_the_c10d_losses(tmp_path):
    args = [str(EXAMPLES / "train_ddp.py"), "--steps", "40"]
    c10d_out, c10d_err = run_torchrun(args + ["--save", "c10d.pt"], 2, cwd=tmp_path)
    comms_out, comms_err = run_torchrun(args + ["--save", "comms.pt"], 2, env=SWITCH, cwd=tmp_path)
    assert TORCH_TAKES_TORCHCOMMS not in c10d_err
    assert comms_err.count(TORCH_TAKES_TORCHCOMMS) == 2, comms_err[-3000:]
    assert comms_err.count("[TRACE] collectives via") == 2  # the same line as on c10d
    assert losses(comms_out) == losses(c10d_out) and len(losses(c10d_out)) == 2

    import torch

    ours = torch.load(tmp_path / "comms.pt")
    theirs = torch.load(tmp_path / "c10d.pt")
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


@pytest.mark.torchcomms
@needs_torchcomms
@pytest.mark.parametrize("world_size", [2, 3])
def test_conformance_matrix_through_torchcomms(world_size):
    results = run_worker("collectives", world_size, env=SWITCH, timeout=400)
    for result in results:
        assert "checked" in result.stdout
        assert TORCH_TAKES_TORCHCOMMS in result.stderr


@pytest.mark.torchcomms
@needs_torchcomms
def test_torchcomms_own_calls_on_mojo():
    """The calls torchcomms has and c10d has not (the uneven forms, split by
    rank lists, batches), through torchcomms.new_comm("mojo") itself."""
    results = run_worker("torchcomms_api", 3, timeout=180)
    for result in results:
        assert "torchcomms api: all checked" in result.stdout, result.stdout
