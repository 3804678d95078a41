"""torch's second front door: `mojo` as a torchcomms backend.

The marked tests need torchcomms built and installed, and torch-mojo built
against it: `make torchcomms-check` does both (scripts/build-torchcomms.sh)
and runs them. The unmarked ones run in `make test` without torchcomms.
"""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.harness import ROOT, run_torchrun, run_worker
from tests.test_multinode import FABRIC, on_nodes

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
    from torch_mojo.torchcomms import status_line

    assert status_line({"installed": None, "switch": "1"}) == (
        "torchcomms: not installed (TORCH_DISTRIBUTED_USE_TORCHCOMMS on: torch takes the c10d path)")
    line = status_line({"installed": "0.3.0", "switch": "", "backend_built_with": "0.3.0",
                            "entry_point": True, "problem": None})
    assert line == ("torchcomms 0.3.0: backend mojo built against 0.3.0, entry point registered; "
                    "TORCH_DISTRIBUTED_USE_TORCHCOMMS off")


def test_the_doctor_stops_a_job_whose_switch_needs_a_backend_not_built():
    from torch_mojo.doctor.checks import torchcomms_problems
    from torch_mojo.doctor.job import Job
    from torch_mojo.torchcomms import _problem

    problem = _problem(installed="0.3.0", built_with=None)
    facts = {rank: {"torchcomms": {"installed": "0.3.0", "switch": switch, "backend_built_with": None,
                                   "entry_point": True, "problem": problem}}
             for rank, switch in ((0, "1"), (1, "1"), (2, ""))}
    found = torchcomms_problems(Job(facts=facts, missing=[]))
    assert found == [{"severity": "error", "kind": "libraries", "message": problem, "ranks": [0, 1]}]


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
def test_conformance_matrix_through_torchcomms_across_nodes():
    """2 simulated nodes of 2 ranks, over libfabric: the leaders' frames
    between nodes, shared memory within each; and at 4 ranks new_subgroups
    after a new_group that left the last rank out (torch names such groups
    differently on ranks that were in different groups before)."""
    results = run_worker("collectives", 4, env={**FABRIC, **SWITCH}, rank_env=on_nodes("a", "a", "b", "b"),
                         timeout=400)
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


def both_ways(script, nproc, *args, cwd=None, timeout=300):
    """stdout of the example through c10d, then through torchcomms."""
    command = [str(EXAMPLES / script), *map(str, args)]
    c10d, _ = run_torchrun(command, nproc, cwd=cwd, timeout=timeout)
    comms, stderr = run_torchrun(command, nproc, env=SWITCH, cwd=cwd, timeout=timeout)
    assert stderr.count(TORCH_TAKES_TORCHCOMMS) == nproc, stderr[-3000:]
    return c10d, comms


def without_times(stdout):
    return [re.sub(r"in +[0-9.]+ s", "", line) for line in stdout.splitlines() if not line.startswith("[TRACE]")]


@pytest.mark.torchcomms
@needs_torchcomms
@pytest.mark.parametrize("script, nproc, args", [
    ("train_fsdp2.py", 2, ["--steps", 30, "--log-every", 10]),
    ("tensor_parallel.py", 4, []),  # TP, TP+FSDP, HSDP
    ("pipeline.py", 4, []),         # GPipe, 1F1B
    ("compile.py", 2, []),          # functional collectives, DTensor
])
def test_each_example_prints_what_it_prints_through_c10d(script, nproc, args):
    c10d, comms = both_ways(script, nproc, *args)
    assert without_times(comms) == without_times(c10d) and len(without_times(c10d)) >= 2


@pytest.mark.torchcomms
@needs_torchcomms
@pytest.mark.parametrize("script, client", [("accelerate_train.py", "accelerate"),
                                            ("trainer_train.py", "transformers")])
def test_clients_train_the_same_through_torchcomms(script, client):
    """make clients-check's accelerate and Trainer scripts (they run where
    it has installed their clients, as CI does before this check)."""
    pytest.importorskip(client, reason=f"{client} is not installed here: make clients-check installs it")
    c10d, comms = both_ways(f"clients/{script}", 2)
    trained = [line for line in c10d.splitlines() if line.startswith(("step", "resumed"))]
    assert trained and [line for line in comms.splitlines() if line.startswith(("step", "resumed"))] == trained


@pytest.mark.torchcomms
@needs_torchcomms
def test_ddp_options_train_the_same_weights_through_torchcomms(tmp_path):
    import torch

    script = str(EXAMPLES / "ddp_features.py")
    run_torchrun([script, "--save", str(tmp_path / "c10d")], 4, cwd=tmp_path)
    comms, _ = run_torchrun([script, "--save", str(tmp_path / "comms")], 4, env=SWITCH, cwd=tmp_path)
    assert "through torchcomms, no gloo group to compare with" in comms
    saved = sorted(path.name for path in (tmp_path / "c10d").iterdir())
    assert len(saved) == 9 and saved == sorted(path.name for path in (tmp_path / "comms").iterdir())
    for name in saved:
        ours, theirs = torch.load(tmp_path / "comms" / name), torch.load(tmp_path / "c10d" / name)
        assert all(torch.equal(ours[key], theirs[key]) for key in theirs), name


@pytest.mark.torchcomms
@needs_torchcomms
def test_a_checkpoint_saved_through_torchcomms_resumes_through_c10d(tmp_path):
    first = run_torchrun([str(EXAMPLES / "checkpoint.py"), "--save", str(tmp_path / "ckpt"), "--at", "5",
                          "--steps", "10"], 2, env=SWITCH, cwd=tmp_path)[0]
    resumed = run_torchrun([str(EXAMPLES / "checkpoint.py"), "--resume", str(tmp_path / "ckpt"), "--at", "5",
                            "--steps", "10"], 2, cwd=tmp_path)[0]
    assert "resumed step 5" in resumed and losses_by_step(resumed) == losses_by_step(first)
    assert len(losses_by_step(first)) == 5  # steps 6 to 10, after the save


def losses_by_step(stdout):
    return [line for line in stdout.splitlines() if line.startswith("step")]


# A file of each kind of torchcomms' own tests: its collectives, batch,
# split, objects, the c10d layer over it, its fault-tolerance calls and its
# flight recorder (about a minute and a half). `make torchcomms-suite` runs
# every file, at 2 and 4 ranks.
OWN_TESTS_IN_CHECK = {  # file: how many of its tests pass at 2 ranks
    "AllReduceTest": 5, "AllToAllvSingleTest": 1, "BatchSendRecvTest": 5, "C10dTorchCommTest": 30,
    "FlightRecorderAbortTest": 1, "FlightRecorderTest": 25, "GetInitHandleTest": 2, "ObjColTest": 10,
    "ReconfigureTest": 8, "ReduceScatterVTest": 5, "SplitTest": 5, "WaitBlockingTest": 3,
}


@pytest.mark.torchcomms
@needs_torchcomms
def test_torchcomms_own_tests_pass_on_mojo():
    """torchcomms' integration tests with TEST_BACKEND=mojo: every one that
    applies to CPU tensors passes or is skipped by torchcomms itself."""
    source = os.environ.get("TORCH_MOJO_TORCHCOMMS_SOURCE")
    if not source:
        pytest.skip("TORCH_MOJO_TORCHCOMMS_SOURCE (torchcomms' source tree) is not set: make torchcomms-check sets it")
    done = subprocess.run([sys.executable, "-m", "tests.torchcomms_suite.run", "--source", source,
                           "--world-size", "2", "--only", *OWN_TESTS_IN_CHECK], cwd=ROOT, capture_output=True,
                          text=True, timeout=280, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-8000:]
    passed = dict(re.findall(r"^(\w+) +(\d+) passed", done.stdout, re.MULTILINE))
    assert {name: int(count) for name, count in passed.items()} == OWN_TESTS_IN_CHECK, done.stdout


@pytest.mark.torchcomms
@needs_torchcomms
def test_a_dead_rank_is_dropped_and_a_new_one_joins_through_reconfigure():
    results = run_worker("torchcomms_reconfigure", 4, env={"TORCH_MOJO_BACKEND_PG_WATCHDOG": "raise"},
                         check=False, timeout=240)
    survivors, dead = results[:3], results[3]
    assert dead.returncode == -9, dead.stderr[-3000:]
    for result in survivors:
        assert result.returncode == 0, result.stdout + result.stderr[-4000:]
        assert "round 2: failed in" in result.stdout, result.stdout
        for round_name, size in (("round 1", 4), ("round 2", 3), ("round 3", 4)):
            assert f"{round_name}: rank {result.rank} of {size}: right" in result.stdout, result.stdout
    assert "round 3 (joiner): rank 3 of 4: right" in survivors[0].stdout, survivors[0].stdout
    assert "joiner exit 0" in survivors[0].stdout
