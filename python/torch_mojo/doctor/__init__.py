"""``torch-mojo doctor``: checks a job's set-up before it trains.

Run it with the launcher and node count of the training job::

    srun -N 2 --ntasks-per-node=4 torch-mojo doctor
    torchrun --nnodes 2 --nproc-per-node 4 ... -m torch_mojo.doctor
    torch-mojo doctor --nproc 4                 # one node, ranks started here
    torch-mojo doctor --nccl-log nccl.*.log     # which network RCCL/NCCL used

Every rank reports where it runs, its cores, device, collective libraries
and transports; rank 0 prints one table for the job, the latency and
bandwidth measured within each node and between nodes, and every problem
found. The exit status is 1 when a problem would make training fail or
crawl, on every rank.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

from torch_mojo import launcher

MEASURE_TIMEOUT_S = 60


class DoctorError(RuntimeError):
    """What stops one rank of the doctor, said on that rank."""


def parse(argv):
    from torch_mojo.bench import parse_size

    parser = argparse.ArgumentParser(prog="torch-mojo doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2,
                        help="ranks to start on this machine when not run under a launcher (default 2)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--size", type=parse_size, default=16 << 20,
                        help="bytes of the bandwidth measurements and the all-reduce (default 16M)")
    parser.add_argument("--nccl-log", nargs="+", metavar="FILE",
                        help="instead of a job: read RCCL/NCCL's NCCL_DEBUG=INFO output (NCCL_DEBUG_FILE per rank, or "
                        "a job's combined log) and say which network they used between nodes, per host")
    parser.add_argument("--timeout", type=float, default=MEASURE_TIMEOUT_S,
                        help="the process group's timeout for the measurements, in seconds: a measurement "
                        f"that takes longer ends the job with the watchdog's report (default {MEASURE_TIMEOUT_S})")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.nccl_log:
        return check_nccl_logs(args.nccl_log, args.json)
    if not launcher.is_rank_of_a_job():
        return start_ranks(args.nproc, sys.argv[1:] if argv is None else argv)
    try:
        launcher.adopt_launcher_environment()
        return run_rank(args)
    except (DoctorError, launcher.LauncherError) as error:
        print(f"torch-mojo doctor, rank {os.environ.get('RANK', '?')}: {error}", file=sys.stderr)
        return 1


def check_nccl_logs(paths: list[str], as_json: bool) -> int:
    from torch_mojo.doctor import nccl_log

    try:
        hosts = nccl_log.read(paths)
    except OSError as error:
        print(f"torch-mojo doctor: {error}", file=sys.stderr)
        return 1
    found = nccl_log.problems(hosts)
    status = int(not hosts or any(severity == "error" for severity, _ in found))
    if as_json:
        print(json.dumps({"hosts": [nccl_log.summary(log, len(hosts)) for log in hosts.values()],
                          "problems": [{"severity": severity, "message": message} for severity, message in found],
                          "status": status}, indent=2))
    elif not hosts:
        lines = "".join(f"\n    {line}" for line in nccl_log.first_lines(paths))
        print(f"no NCCL INFO lines in {', '.join(paths)}: expected lines of the form `host:pid:tid [device] NCCL "
              f"INFO message` (after any prefix a launcher or a timestamp puts); {nccl_log.HOW_TO_LOG}"
              + (f". The first lines read:{lines}" if lines else ". The files are empty."))
    else:
        print("\n".join(nccl_log.report_lines(hosts, found)))
    return status


def start_ranks(nproc: int, argv: list[str]) -> int:
    """One node: `nproc` ranks of the doctor on this machine, with the
    variables torchrun gives its workers; 1 when any rank failed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    processes = []
    for rank in range(nproc):
        environ = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                   "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        processes.append(subprocess.Popen([sys.executable, "-m", "torch_mojo.doctor", *argv], env=environ))
    statuses = [process.wait() for process in processes]
    return 0 if all(status == 0 for status in statuses) else 1


def bootstrap_timeout() -> float:
    from torch_mojo.env import BY_NAME

    variable = BY_NAME["MOJOCCL_BOOTSTRAP_TIMEOUT_S"]
    value = os.environ.get(variable.name) or variable.default
    problem = variable.problem_with(value)
    if problem:
        raise DoctorError(problem)
    return float(value)


def job_variables() -> tuple[int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise DoctorError("RANK and WORLD_SIZE must be integers (a launcher sets them, with MASTER_ADDR "
                          "and MASTER_PORT)") from None


# ------------------------------------------------------------- cache markers

def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def marker_path(cache: dict, node: str) -> str:
    """A file of this job and node in the cache directory: the other nodes
    look for it to tell whether they share the directory."""
    job = "/".join(os.environ.get(name, "") for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                                                          "SLURM_JOB_ID"))
    return os.path.join(cache["path"], f".doctor-{_digest(job)}-{_digest(node)}")


@contextlib.contextmanager
def node_marker(facts: dict):
    """Local rank 0 of each node leaves a marker in the cache directory for
    the doctor's run (where the directory is writable)."""
    path = marker_path(facts["cache"], facts["node"])
    mine = facts["local_rank"] == 0 and facts["cache"]["writable"]
    if mine:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
    try:
        yield
    finally:
        if mine:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def nodes_seen(nodes: list[str], facts: dict) -> list[str] | None:
    """The nodes whose markers local rank 0 finds (None for the others)."""
    if facts["local_rank"] != 0:
        return None
    return [node for node in nodes if os.path.exists(marker_path(facts["cache"], node))]


# ------------------------------------------------------------- the ranks

def run_rank(args) -> int:
    from torch_mojo.doctor import job
    from torch_mojo.doctor.facts import gather

    rank, world_size = job_variables()
    timeout = bootstrap_timeout()
    try:
        store = job.connect(timeout)
    except Exception as error:  # noqa: BLE001  whatever the store says is the message
        raise DoctorError(f"the job's store at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
                          f"failed within {timeout:.0f} s: {error}") from None
    try:
        facts = gather()
    except Exception as error:  # noqa: BLE001  reported by rank 0 as this rank's problem
        store.set(f"facts/{rank}", json.dumps({"rank": rank, "gather_error": f"{type(error).__name__}: {error}"}))
        raise DoctorError(f"could not gather this rank's facts: {error}") from error
    with node_marker(facts):
        store.set(f"facts/{rank}", json.dumps(facts))
        if rank == 0:
            return coordinate(store, facts, world_size, timeout, args)
        return follow(store, facts, rank, world_size, timeout, args)


def coordinate(store, mine: dict, world_size: int, timeout: float, args) -> int:
    """Rank 0: collects the facts, prints what they show, leads the
    measurements, prints the rest, and posts the exit status."""
    from torch_mojo.doctor import checks, job, report

    found = job.collect_facts(store, world_size, time.monotonic() + timeout)
    problems = checks.before_measurements(found, timeout)
    rounds = job.plan(found.facts) if checks.measurements_possible(problems) else None
    nodes = sorted({facts["node"] for facts in found.facts.values()})
    store.set("plan", json.dumps({"rounds": rounds, "nodes": nodes}))
    if not args.json:
        print("\n".join(report.header_lines(found, world_size) + report.problem_lines(problems)), flush=True)
    store.set("seen/0", json.dumps(nodes_seen(nodes, mine)))
    if rounds is not None:
        with contextlib.suppress(job.MeasurementFailed):  # posted, and reported below
            job.measure(store, rounds, 0, world_size, args.size, args.timeout)
        job.results(store, found, rounds)
    seen_by = job.posted(store, [f"seen/{rank}" for rank in found.facts], time.monotonic() + 10)
    later = checks.after_measurements(found, {int(key.split("/")[1]): value for key, value in seen_by.items()
                                              if value is not None})
    everything = checks.ordered(problems + later)
    status = 1 if any(item["severity"] == "error" for item in everything) else 0
    if args.json:
        print(json.dumps(report.summary(found, world_size, everything, status, rounds is not None), indent=2))
    else:
        lines = report.measurement_lines(found, args.size) if rounds is not None else \
            ["", "measurements skipped: fix the errors above first"]
        print("\n".join(lines + report.problem_lines(later) + report.verdict_lines(everything)))
    sys.stdout.flush()
    store.set("verdict", str(status))
    # The store lives in this process: keep it until every rank has read
    # the verdict (one whose measurement failed waits for the timeout).
    job.posted(store, [f"done/{rank}" for rank in found.facts if rank], time.monotonic() + args.timeout + 10)
    return status


def follow(store, mine: dict, rank: int, world_size: int, timeout: float, args) -> int:
    """Every other rank: the plan, the markers it sees, its part of the
    measurements, and rank 0's verdict."""
    from torch_mojo.doctor import job

    try:
        plan = json.loads(job.wait_for(store, "plan", timeout + 30))
        store.set(f"seen/{rank}", json.dumps(nodes_seen(plan["nodes"], mine)))
        if plan["rounds"] is not None:
            with contextlib.suppress(job.MeasurementFailed):  # rank 0 reports it
                job.measure(store, plan["rounds"], rank, world_size, args.size, args.timeout)
        status = int(job.wait_for(store, "verdict", timeout + args.timeout * 4))
        store.set(f"done/{rank}", "")
        return status
    except TimeoutError as error:
        raise DoctorError(str(error)) from None
    except RuntimeError as error:  # the store went away: rank 0 ended first
        raise DoctorError(f"lost rank 0's store ({error}): see rank 0's output") from None
