"""Runs real multi-process jobs for the tests: N processes, a timeout on
the whole job, and every rank's output in the failure message."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    pid: int = 0  # of the process started (the rank itself unless a rank_prefix wraps it)


class JobFailed(AssertionError):
    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr  # all of it, where the message keeps a tail


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _report(results: list[RankResult], headline: str) -> str:
    parts = [headline]
    for result in results:
        parts.append(f"--- rank {result.rank} (exit {result.returncode}) stdout:\n{result.stdout}")
        parts.append(f"--- rank {result.rank} stderr:\n{result.stderr[-6000:]}")
    return "\n".join(parts)


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class RanksJob:
    """`command` started once per rank with torchrun's variables set (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT). Output goes to files: a pipe
    that nobody drains would block a chatty rank, and with it every rank
    waiting for it."""

    def __init__(self, command, world_size, env=None, rank_env=None, rank_prefix=None):
        self.scratch = tempfile.TemporaryDirectory()
        port = free_port()
        self.processes = []
        for rank in range(world_size):
            rank_vars = {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": str(ROOT),
                "TEST_SCRATCH": self.scratch.name,
            }
            full_env = {**os.environ, **rank_vars, **(env or {}), **((rank_env or {}).get(rank, {}))}
            out = open(os.path.join(self.scratch.name, f"rank{rank}.out"), "w+")
            err = open(os.path.join(self.scratch.name, f"rank{rank}.err"), "w+")
            argv = [*(rank_prefix or {}).get(rank, []), *command]  # e.g. unshare for one "node"
            # SIGINT as a terminal leaves it, whoever started the tests (a
            # background job of a script ignores it, and so would its ranks).
            process = subprocess.Popen(argv, env=full_env, cwd=self.scratch.name, stdout=out, stderr=err,
                                       preexec_fn=_default_sigint)
            self.processes.append((process, out, err))

    def stdout(self, rank):
        with open(os.path.join(self.scratch.name, f"rank{rank}.out")) as file:
            return file.read()

    def wait_for_output(self, rank, text, timeout=60):
        deadline = time.monotonic() + timeout
        while text not in self.stdout(rank):
            if time.monotonic() > deadline:
                raise JobFailed(f"rank {rank} never printed {text!r}")
            time.sleep(0.05)

    def signal(self, number):
        for process, _, _ in self.processes:
            if process.poll() is None:
                process.send_signal(number)

    def wait(self, timeout, check=True):
        deadline = time.monotonic() + timeout
        timed_out = False
        for process, _, _ in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                for other, _, _ in self.processes:
                    other.kill()
                    other.wait()
                break
        results = []
        for rank, (process, out, err) in enumerate(self.processes):
            out.seek(0)
            err.seek(0)
            results.append(RankResult(rank, process.returncode, out.read(), err.read(), process.pid))
            out.close()
            err.close()
        self.scratch.cleanup()
        if timed_out:
            raise JobFailed(_report(results, f"job did not finish within {timeout} s"))
        if check and any(result.returncode != 0 for result in results):
            raise JobFailed(_report(results, "a rank failed"))
        return results


def run_ranks(
    command: list[str],
    world_size: int,
    *,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    rank_env: dict[int, dict[str, str]] | None = None,
    rank_prefix: dict[int, list[str]] | None = None,
    check: bool = True,
) -> list[RankResult]:
    """Runs `command` on `world_size` ranks and waits for all of them. A job
    that outlives `timeout` is killed and fails the test."""
    return RanksJob(command, world_size, env, rank_env, rank_prefix).wait(timeout, check)


def worker_command(name: str, *args: str) -> list[str]:
    return [sys.executable, str(WORKERS / f"{name}.py"), *args]


def run_worker(name: str, world_size: int, *args: str, **kwargs) -> list[RankResult]:
    """Runs tests/workers/<name>.py on `world_size` ranks."""
    return run_ranks(worker_command(name, *args), world_size, **kwargs)


def processes_below(parent: int) -> list[int]:
    """Every process descended from `parent`, children before their parent's
    siblings' children."""
    children = []
    for task in Path(f"/proc/{parent}/task").glob("*"):
        try:
            children += (task / "children").read_text().split()
        except OSError:
            pass  # the task ended meanwhile
    return [pid for child in map(int, children) for pid in [child, *processes_below(child)]]


def end_hung_job(launcher: int):
    """End a launcher that did not finish, and everything it started, telling
    first where each process was. torchrun starts each worker in a session of
    its own, so killing torchrun's process group would leave the workers
    running, holding the pipes a test reads. SIGABRT makes Python's
    faulthandler (PYTHONFAULTHANDLER, set by run_torchrun) print every
    thread's stack to the job's stderr before the process dies."""
    job = [launcher, *processes_below(launcher)]  # the launcher first: it would act on a worker's death
    for pid in job:  # one at a time, so that their stacks do not interleave
        signal_each([pid], signal.SIGABRT)
        time.sleep(1)
    signal_each(job, signal.SIGKILL)


def signal_each(pids: list[int], signal_number: int):
    for pid in pids:
        try:
            os.kill(pid, signal_number)
        except ProcessLookupError:
            pass


def run_torchrun(script_args: list[str], nproc: int, *, timeout: float = 180, env=None, cwd=None):
    """`torchrun --standalone --nproc-per-node=nproc ...`, as a user runs it.
    On timeout torchrun and its workers are killed."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", *script_args]
    process = subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1", **(env or {})},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_hung_job(process.pid)
        stdout, stderr = process.communicate()
        raise JobFailed(f"torchrun did not finish within {timeout} s\n{stdout}\n{stderr[-6000:]}", stderr)
    if process.returncode != 0:
        raise JobFailed(f"torchrun failed ({process.returncode})\n{stdout}\n{stderr[-6000:]}", stderr)
    return stdout, stderr


GLOO_EXIT_ABORT = "terminate called without an active exception"


def run_torchrun_on_gloo(script_args: list[str], nproc: int, **kwargs):
    """A reference run on PyTorch's gloo backend (`--backend gloo`). gloo
    sometimes aborts at interpreter exit after the script has finished
    (docs/troubleshooting.md; seen without torch-mojo too): that failure,
    and only that one, is run again, at most five runs in all. The abort is
    looked for in the whole of stderr: torchrun's report of a failed worker
    can push it out of the failure's message."""
    for attempt in range(5):
        try:
            return run_torchrun([*script_args, "--backend", "gloo"], nproc, **kwargs)
        except JobFailed as failure:
            if GLOO_EXIT_ABORT not in failure.stderr or attempt == 4:
                raise
