"""torchft on `mojo` (torch_mojo.torchft.ProcessGroupMojo), as torchft runs
it: a Lighthouse (torchft's own binary) and replica groups, each a torchrun
job of its own with --max-restarts, training examples/torchft/train_ddp.py
(examples/torchft/replicas.py starts them). A replica group is SIGKILLed
mid-run (or two of three at once), or SIGSTOPped: the others never stop,
every step they commit is counted, the killed ones are restarted by
torchrun, rejoin through the quorum, are healed with a healthy group's
weights (on mojo through the group itself), and all end with the same
weights, bit for bit. The kill also runs on torchft's ProcessGroupGloo,
and on its ProcessGroupTorchComms over `mojo` (reconfigured, not rebuilt;
in make torchcomms-check). A Lighthouse that is not there is named by
every rank; a group started with another setting that must agree, or
another number of ranks, is refused while the other trains on. torchft (requirements-torchft.txt) is installed by
`make torchft-check`; these tests are not in `make test`."""

import importlib.util
import os
import re
import signal
import sys

import pytest

from tests.harness import ROOT

pytestmark = [pytest.mark.torchft, pytest.mark.timeout(600)]
torchft = pytest.importorskip("torchft", reason="torchft is installed by `make torchft-check`")
SCRIPTS = ROOT / "examples" / "torchft"
sys.path.insert(0, str(SCRIPTS))
from replicas import Replicas, final_weights  # noqa: E402  (examples/torchft/replicas.py)


@pytest.fixture
def replicas(tmp_path):
    """Starts a Lighthouse and replica groups training train_ddp.py with a
    step of 50 ms and a group timeout of 5 s; kills what is left at the end."""
    started = []

    def start(backend: str, steps: int, *more_args: str, **kwargs):
        script_args = ["--backend", backend, "--steps", str(steps), "--step-delay", "0.05", "--timeout", "5",
                       *more_args]
        started.append(Replicas(tmp_path, script_args, **kwargs))
        return started[-1]

    yield start
    for each in started:
        each.close()


def every_step_to(steps_taken: list[tuple[int, int, float]], last: int, started_by: int) -> bool:
    """The steps are each one more than the one before, up to `last`, from
    one at most `started_by` (a group that joins after another has
    committed takes that one's step when it is healed)."""
    numbers = [step for step, _, _ in steps_taken]
    return bool(numbers) and numbers[0] <= started_by and numbers == list(range(numbers[0], last + 1))


def healed_at(output: str) -> list[int]:
    """The steps a restarted group was healed to."""
    return [int(step) for step in re.findall(r"healing is required step=0, max_step=(\d+)", output)]


THROUGH_TORCHCOMMS = pytest.param("mojo-torchcomms", marks=[
    pytest.mark.torchcomms,  # make torchcomms-check, where torchcomms is built
    pytest.mark.skipif(importlib.util.find_spec("torch_mojo._torchcomms") is None,
                       reason="torch-mojo is built here without torchcomms (make torchcomms-check)")])


@pytest.mark.parametrize("backend", ["mojo", "gloo", THROUGH_TORCHCOMMS])
def test_a_killed_replica_group_rejoins_while_the_other_trains_on(replicas, backend):
    steps = 60
    # On mojo the weights go to the restarted group through the group itself
    # (torchft's PGTransport: mojo's send and recv across the replica
    # groups); the others use torchft's HTTP server, its default.
    run = replicas(backend, steps, *(["--heal-over", "group"] if backend == "mojo" else []))
    run.wait_for_step(0, 15)
    run.wait_for_step(1, 15)
    run.kill(1)  # mid-step: 0.05 s of each step is outside torchft's calls
    killed_at = run.committed(0)[-1][0]
    run.wait([0, 1])
    healthy, restarted = run.output(0), run.output(1)
    # The healthy group never stopped: it committed every step, some alone.
    steps_taken = run.committed(0)
    assert every_step_to(steps_taken, steps, started_by=killed_at), steps_taken
    assert any(participants == 1 for step, participants, _ in steps_taken if step > killed_at), steps_taken
    assert steps_taken[-1][1] == 2, "the restarted group did not rejoin"
    # The killed one was started again by torchrun, healed from the other
    # at the step the other had reached, and finished with it.
    assert restarted.count("Manager listening on") == 2, restarted[-4000:]
    assert healed_at(restarted) and healed_at(restarted)[-1] >= 15, restarted[-4000:]
    assert final_weights(healthy) == final_weights(restarted) == {0: (steps, final_weights(healthy)[0][1])}


@pytest.mark.parametrize("backend", ["mojo", THROUGH_TORCHCOMMS])
def test_a_stopped_replica_group_is_dropped_by_timeout(replicas, backend):
    """SIGSTOP: the peer neither answers nor dies. Its group's calls time out
    (5 s) in the caller, the quorum drops it, the other group goes on."""
    steps = 40
    run = replicas(backend, steps, restarts=0)
    run.wait_for_step(0, 10)
    run.wait_for_step(1, 10)
    stopped = run.kill(1, sig=signal.SIGSTOP)
    stopped_at = run.committed(0)[-1][0]
    try:
        run.wait([0])
    finally:
        os.kill(stopped, signal.SIGKILL)
    steps_taken = run.committed(0)
    assert every_step_to(steps_taken, steps, started_by=stopped_at), steps_taken
    assert steps_taken[-1][1] == 1 and final_weights(run.output(0))[0][0] == steps


def test_two_of_three_groups_killed_at_once_both_rejoin(replicas):
    # A Lighthouse of 3 groups wants 2 (--min_replicas 2): with 1, the two
    # restarted groups can form a quorum of their own at step 0 and train
    # apart from the survivor (torchft's rule against a split needs a
    # majority; seen here 1 run in 2). So the survivor waits until a group
    # is back, heals it (the step of the healing counts the survivor's
    # data alone: the healed do not take part), and goes on.
    steps = 60
    run = replicas("mojo", steps, groups=3, min_replicas=2)
    for replica in range(3):
        run.wait_for_step(replica, 15)
    run.kill(1)
    run.kill(2)
    killed_at = run.committed(0)[-1][0]
    run.wait([0, 1, 2])
    steps_taken = run.committed(0)
    assert every_step_to(steps_taken, steps, started_by=killed_at), steps_taken
    assert steps_taken[-1][1] == 3, "the restarted groups did not both rejoin"
    for replica in (1, 2):
        assert healed_at(run.output(replica)) and healed_at(run.output(replica))[-1] >= 15, run.output(replica)[-4000:]
    ends = [final_weights(run.output(replica)) for replica in range(3)]
    assert ends[0] == ends[1] == ends[2] and ends[0][0][0] == steps, ends


def test_a_lighthouse_that_is_not_there_is_named_by_every_rank(replicas):
    run = replicas("mojo", 5, groups=1, nproc=2, restarts=0, lighthouse=False)
    run.wait([0], timeout=60)  # 5 s of waiting, and start-up
    output = run.output(0)
    said = f"torchft's Lighthouse at http://localhost:{run.lighthouse_port} did not answer within 5 s"
    assert output.count(said) == 2 and "start torchft_lighthouse there first" in output, output[-4000:]
    assert run.groups[0].returncode != 0


def test_a_lighthouse_gone_mid_run_is_named_by_every_rank(replicas):
    run = replicas("mojo", 1000, "--quorum-timeout", "10", nproc=2, restarts=0)
    run.wait_for_step(0, 5)
    run.wait_for_step(1, 5)
    run.lighthouse.kill()
    run.wait([0, 1], timeout=60)  # the quorum's 10 s, and the group's end
    said = f"torchft's Lighthouse at http://localhost:{run.lighthouse_port} did not answer within 1 s"
    for replica in (0, 1):
        assert run.output(replica).count(said) == 2, run.output(replica)[-4000:]


def test_hsdp_groups_of_two_ranks_heal_shard_by_shard(replicas):
    # FSDP2 within each group of 2 ranks (a mojo group of its own), torchft
    # across the groups; group 1's second rank killed: torchrun restarts the
    # whole group, and each rank is healed by the rank of its number.
    steps = 40
    run = replicas("mojo", steps, nproc=2, script=SCRIPTS / "train_hsdp.py")
    run.wait_for_step(0, 12)
    run.wait_for_step(1, 12)
    run.kill(1, local_rank=1)
    killed_at = run.committed(0)[-1][0]
    run.wait([0, 1])
    steps_taken = run.committed(0)
    assert every_step_to(steps_taken, steps, started_by=killed_at), steps_taken
    assert steps_taken[-1][1] == 2, "the restarted group did not rejoin"
    restarted = run.output(1)
    assert restarted.count("Manager listening on") == 2 and healed_at(restarted), restarted[-4000:]
    ends = final_weights(run.output(0))
    assert ends == final_weights(restarted) and sorted(ends) == [0, 1], ends
    assert ends[0][0] == steps and ends[0][1] != ends[1][1]  # two shards, each alike across the groups


@pytest.mark.parametrize("backend, differs", [("mojo", "setting"), ("mojo", "world size"),
                                              pytest.param("mojo-torchcomms", "setting", marks=THROUGH_TORCHCOMMS.marks)])
def test_a_replica_group_that_disagrees_is_refused_and_the_other_trains_on(replicas, backend, differs):
    """A group started later with another MOJOCCL_DETERMINISTIC, or with
    another number of ranks: it ends, naming what differs, at its first
    quorum and again at each of torchrun's restarts (before it joins one);
    the group that was there first skips that one quorum, commits every
    step, and trains on after the other has ended."""
    hsdp = differs == "world size"
    run = replicas(backend, 100000, groups=1, restarts=1, nproc=2 if hsdp else 1,
                   script=SCRIPTS / ("train_hsdp.py" if hsdp else "train_ddp.py"))
    run.wait_for_step(0, 5)
    late = run.add_group(**({"nproc": 1} if hsdp else {"env": {"MOJOCCL_DETERMINISTIC": "1"}}))
    run.wait([late])
    run.wait_for_step(0, run.committed(0)[-1][0] + 5)
    name = "train_hsdp" if hsdp else "train_ddp"
    what = (f"the replica group's number of ranks is 2 in replica group {name}_0 and 1 in replica group {name}_1"
            if hsdp else f"MOJOCCL_DETERMINISTIC is 0 in replica group {name}_0 and 1 in replica group {name}_1")
    refused = (f"torch-mojo: replica group {name}_1 cannot train with replica group {name}_0 ({what}): set it "
               f"alike on every replica group. Replica group {name}_1 ends; the others train on.")
    assert run.groups[late].returncode != 0 and run.output(late).count(refused) >= 2, run.output(late)[-4000:]
    assert f"RuntimeError: {refused}" in run.output(late)  # the restart's: refused before it joins a quorum
    steps_taken = run.committed(0)
    assert every_step_to(steps_taken, steps_taken[-1][0], started_by=1), steps_taken
    assert all(participants == 1 for _, participants, _ in steps_taken), steps_taken
    assert f"torch-mojo: replica group {name}_1 cannot train with this group ({what})" in run.output(0)
