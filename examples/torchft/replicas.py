"""A torchft job on one machine: a Lighthouse (torchft's own binary) and
replica groups, each a torchrun job of its own with --max-restarts, as a
cluster would start them on separate nodes. What make torchft-check and
benchmarks/torchft_replicas.py run; a way to watch a group die and rejoin.

    python examples/torchft/replicas.py --groups 3 --backend mojo --steps 60 --kill 1@20

prints each group's committed steps as they come (`replica R step S ...`,
from examples/torchft/train_ddp.py) and, with --kill G@S, SIGKILLs group
G's first rank once it has committed step S: torchrun restarts it, it
rejoins at the next quorum and is healed from a healthy group.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Not anchored to lines: a group's ranks and torchft's logger share one
# file, and another process's text can land before a line's newline.
STEP = re.compile(r"replica (\d+) step (\d+) loss \S+ participants (\d+) time (\d+\.\d{3})")
DONE = re.compile(r"replica (\d+)(?: rank (\d+))? done step (\d+) weights ([0-9a-f]{16})")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def start_lighthouse(log: Path, port: int, min_replicas: int = 1) -> subprocess.Popen:
    """torchft's Lighthouse, forming a quorum every 100 ms of whoever
    joined within a second, of at least `min_replicas` groups."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "torchft_lighthouse"), "--min_replicas", str(min_replicas),
         "--quorum_tick_ms", "100", "--join_timeout_ms", "1000", "--bind", f"[::]:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)


class Replicas:
    """`groups` replica groups of `nproc` ranks running `script` with
    `script_args`, and a Lighthouse on `lighthouse_port` (started here
    unless `lighthouse` is False); their output in files under `directory`."""

    def __init__(self, directory: Path, script_args: list[str], groups: int = 2, nproc: int = 1,
                 restarts: int = 2, script: Path = HERE / "train_ddp.py", lighthouse: bool = True,
                 lighthouse_port: int | None = None, min_replicas: int = 1, env: dict | None = None):
        self.directory = Path(directory)
        self.script = Path(script)
        self.nproc = nproc
        self.lighthouse_port = lighthouse_port or free_port()
        self.lighthouse = (start_lighthouse(self.directory / "lighthouse.log", self.lighthouse_port, min_replicas)
                           if lighthouse else None)
        self.script_args = script_args
        self.restarts = restarts
        self.environ = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_MOJO_BACKEND_TRACE": "0",
                        "TORCHFT_LIGHTHOUSE": f"http://localhost:{self.lighthouse_port}", **(env or {})}
        self.groups: list[subprocess.Popen] = []
        for _ in range(groups):
            self.add_group()

    def add_group(self, nproc: int | None = None, env: dict | None = None) -> int:
        """Starts one more replica group (of `nproc` ranks, with `env` added
        to the others' environment); returns its number."""
        replica = len(self.groups)
        self.groups.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc or self.nproc}",
             f"--max-restarts={self.restarts}", f"--master-port={free_port()}", str(self.script),
             *self.script_args],
            env={**self.environ, **(env or {}), "REPLICA_GROUP_ID": str(replica)},
            stdout=open(self.log(replica), "w"), stderr=subprocess.STDOUT, start_new_session=True))
        return replica

    def log(self, replica: int) -> Path:
        return self.directory / f"replica{replica}.log"

    def output(self, replica: int) -> str:
        return self.log(replica).read_text()

    def committed(self, replica: int) -> list[tuple[int, int, float]]:
        """(step, participants, time) of every step the first rank of
        `replica` committed."""
        return committed(self.output(replica), replica)

    def wait_for_step(self, replica: int, step: int, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(found[0] >= step for found in self.committed(replica)):
                return
            time.sleep(0.05)
        raise AssertionError(f"replica {replica} did not reach step {step}:\n{self.output(replica)[-4000:]}")

    def workers(self, replica: int) -> list[int]:
        """The processes torchrun runs for `replica` now."""
        torchrun = self.groups[replica].pid
        try:
            return [int(pid) for pid in Path(f"/proc/{torchrun}/task/{torchrun}/children").read_text().split()]
        except OSError:
            return []  # torchrun has ended

    def worker(self, replica: int, local_rank: int = 0) -> int:
        """The process torchrun runs as `local_rank` of `replica`."""
        for pid in self.workers(replica):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if str(self.script) in Path(f"/proc/{pid}/cmdline").read_text() and \
                    f"LOCAL_RANK={local_rank}".encode() in environ:
                return int(pid)
        raise LookupError(f"replica {replica} has no local rank {local_rank} running")

    def kill(self, replica: int, local_rank: int = 0, sig: int = signal.SIGKILL) -> int:
        pid = self.worker(replica, local_rank)
        os.kill(pid, sig)
        return pid

    def wait(self, replicas, timeout: float = 180):
        for replica in replicas:
            self.groups[replica].wait(timeout=timeout)

    def close(self):
        # torchrun starts each worker in a session of its own: they are killed apart
        workers = [pid for replica in range(len(self.groups)) for pid in self.workers(replica)]
        for process in [*self.groups, *([self.lighthouse] if self.lighthouse else [])]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def committed(output: str, replica: int) -> list[tuple[int, int, float]]:
    """(step, participants, time: seconds since 1970) of every step
    `replica` committed, in `output`."""
    return [(int(step), int(participants), float(seconds)) for who, step, participants, seconds
            in STEP.findall(output) if int(who) == replica]


def final_weights(output: str) -> dict[int, tuple[int, str]]:
    """{rank: (last step, digest of its weights)} that a replica group's
    ranks printed at their end (rank 0 alone where the group's ranks print
    one line, their weights being alike)."""
    return {int(rank or 0): (int(step), weights) for _, rank, step, weights in DONE.findall(output)}


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--nproc-per-group", type=int, default=1)
    parser.add_argument("--kill", metavar="GROUP@STEP", help="SIGKILL GROUP's first rank after its step STEP")
    parser.add_argument("--script", default=str(HERE / "train_ddp.py"), help="what each rank runs")
    parser.add_argument("--directory", help="where the logs go (default: a new temporary directory)")
    args, script_args = parser.parse_known_args()
    return args, script_args


def main():
    args, script_args = parse()
    directory = Path(args.directory or tempfile.mkdtemp(prefix="torchft-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"logs in {directory}", flush=True)
    run = Replicas(directory, script_args, groups=args.groups, nproc=args.nproc_per_group, script=Path(args.script))
    try:
        if args.kill:
            group, step = (int(part) for part in args.kill.split("@"))
            run.wait_for_step(group, step)
            print(f"killed replica {group} (pid {run.kill(group)}) after its step {step}", flush=True)
        run.wait(range(args.groups), timeout=None)
    finally:
        run.close()
    for replica in range(args.groups):
        output = run.output(replica)
        steps = committed(output, replica)
        starts = output.count("Manager listening on")  # from the group's first rank, which runs the Manager server
        ended = ", ".join(f"rank {rank} at step {step} with weights {weights}"
                          for rank, (step, weights) in sorted(final_weights(output).items()))
        print(f"replica {replica}: {len(steps)} steps committed, restarted {starts - 1} times; {ended}")


if __name__ == "__main__":
    main()
