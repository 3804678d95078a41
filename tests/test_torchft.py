"""torchft on `mojo` (torch_mojo.torchft.ProcessGroupMojo), as torchft runs
it: a Lighthouse (torchft's own binary) and replica groups, each a torchrun
job of its own with --max-restarts, training examples/torchft/train_ddp.py.
A replica group is SIGKILLed mid-run, or SIGSTOPped: the other never
stops, every step it commits is counted, the killed one is restarted by
torchrun, rejoins through the quorum, is healed with the other's weights,
and both end with the same weights, bit for bit. The same runs on torchft's
ProcessGroupGloo. torchft (requirements-torchft.txt) is installed by `make
torchft-check`; these tests are not in `make test`."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import ROOT, free_port

pytestmark = [pytest.mark.torchft, pytest.mark.timeout(600)]
torchft = pytest.importorskip("torchft", reason="torchft is installed by `make torchft-check`")

SCRIPT = ROOT / "examples" / "torchft" / "train_ddp.py"
STEP = re.compile(r"^replica (\d+) step (\d+) loss \S+ participants (\d+) t (\S+)$", re.M)
DONE = re.compile(r"^replica (\d+) done step (\d+) weights (\w+)$", re.M)


class Replicas:
    """A Lighthouse and `count` replica groups of one rank, each under its
    own torchrun; their output in files under `directory`."""

    def __init__(self, directory: Path, backend: str, steps: int, count: int = 2, restarts: int = 2):
        self.directory = directory
        lighthouse_port = free_port()
        self.lighthouse = subprocess.Popen(
            [str(Path(sys.executable).parent / "torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms",
             "100", "--join_timeout_ms", "1000", "--bind", f"[::]:{lighthouse_port}"],
            stdout=subprocess.DEVNULL, stderr=open(directory / "lighthouse.log", "w"), start_new_session=True)
        environ = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHFT_LIGHTHOUSE": f"http://localhost:{lighthouse_port}",
                   "TORCH_MOJO_BACKEND_TRACE": "0"}
        self.groups = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", f"--max-restarts={restarts}",
             f"--master-port={free_port()}", str(SCRIPT), "--backend", backend, "--steps", str(steps),
             "--step-delay", "0.05", "--timeout", "5"],
            env={**environ, "REPLICA_GROUP_ID": str(replica)}, stdout=open(self.log(replica), "w"),
            stderr=subprocess.STDOUT, start_new_session=True) for replica in range(count)]

    def log(self, replica: int) -> Path:
        return self.directory / f"replica{replica}.log"

    def output(self, replica: int) -> str:
        return self.log(replica).read_text()

    def wait_for_step(self, replica: int, step: int, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(int(found[1]) >= step for found in STEP.findall(self.output(replica))):
                return
            time.sleep(0.1)
        raise AssertionError(f"replica {replica} did not reach step {step}:\n{self.output(replica)[-4000:]}")

    def worker(self, replica: int) -> int:
        """The training process torchrun runs for `replica` (its child)."""
        torchrun = self.groups[replica].pid
        children = Path(f"/proc/{torchrun}/task/{torchrun}/children").read_text().split()
        return next(int(pid) for pid in children if str(SCRIPT) in Path(f"/proc/{pid}/cmdline").read_text())

    def wait(self, replicas, timeout: float = 180):
        for replica in replicas:
            self.groups[replica].wait(timeout=timeout)

    def close(self):
        for process in [*self.groups, self.lighthouse]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def replicas(tmp_path):
    started = []

    def start(*args, **kwargs):
        started.append(Replicas(tmp_path, *args, **kwargs))
        return started[-1]

    yield start
    for each in started:
        each.close()


def committed(output: str, replica: int) -> list[tuple[int, int]]:
    """(step, participants) of every step `replica` committed."""
    return [(int(step), int(participants)) for who, step, participants, _ in STEP.findall(output)
            if int(who) == replica]


def every_step_to(steps_taken: list[tuple[int, int]], last: int, started_by: int) -> bool:
    """The steps are each one more than the one before, up to `last`, from
    one at most `started_by` (a group that joins after another has
    committed takes that one's step when it is healed)."""
    numbers = [step for step, _ in steps_taken]
    return bool(numbers) and numbers[0] <= started_by and numbers == list(range(numbers[0], last + 1))


def final_weights(output: str) -> tuple[int, str]:
    [(_, step, weights)] = DONE.findall(output)
    return int(step), weights


@pytest.mark.parametrize("backend", ["mojo", "gloo"])
def test_a_killed_replica_group_rejoins_while_the_other_trains_on(replicas, backend):
    steps = 60
    run = replicas(backend, steps)
    run.wait_for_step(0, 15)
    run.wait_for_step(1, 15)
    os.kill(run.worker(1), signal.SIGKILL)  # mid-step: 0.05 s of each step is outside torchft's calls
    killed_at = committed(run.output(0), 0)[-1][0]
    run.wait([0, 1])
    healthy, restarted = run.output(0), run.output(1)
    # The healthy group never stopped: it committed every step, some alone.
    steps_taken = committed(healthy, 0)
    assert every_step_to(steps_taken, steps, started_by=killed_at), " ".join(str(step) for step, _ in steps_taken)
    assert any(participants == 1 for step, participants in steps_taken if step > killed_at), steps_taken
    assert steps_taken[-1][1] == 2, "the restarted group did not rejoin"
    # The killed one was started again by torchrun, healed from the other
    # at the step the other had reached, and finished with it.
    assert restarted.count("Manager listening on") == 2, restarted[-4000:]
    healed_at = [int(step) for step in re.findall(r"healing is required step=0, max_step=(\d+)", restarted)]
    assert healed_at and healed_at[-1] >= 15, restarted[-4000:]
    assert final_weights(healthy) == final_weights(restarted) and final_weights(healthy)[0] == steps


def test_a_stopped_replica_group_is_dropped_by_timeout(replicas):
    """SIGSTOP: the peer neither answers nor dies. Its group's calls time out
    (5 s) in the caller, the quorum drops it, the other group goes on."""
    steps = 40
    run = replicas("mojo", steps, restarts=0)
    run.wait_for_step(0, 10)
    run.wait_for_step(1, 10)
    stopped = run.worker(1)
    os.kill(stopped, signal.SIGSTOP)
    stopped_at = committed(run.output(0), 0)[-1][0]
    try:
        run.wait([0])
    finally:
        os.kill(stopped, signal.SIGKILL)
    healthy = run.output(0)
    steps_taken = committed(healthy, 0)
    assert every_step_to(steps_taken, steps, started_by=stopped_at), " ".join(str(step) for step, _ in steps_taken)
    assert steps_taken[-1][1] == 1 and final_weights(healthy)[0] == steps
