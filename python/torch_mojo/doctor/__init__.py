"""``torch-mojo doctor``: checks a job's set-up before it trains.

Run it with the launcher and node count of the training job::

    srun -N 2 --ntasks-per-node=4 torch-mojo doctor
    torchrun --nnodes 2 --nproc-per-node 4 ... -m torch_mojo.doctor
    torch-mojo doctor --nproc 4                 # one node, ranks started here

Every rank reports where it runs, its cores, device, collective libraries
and transports; rank 0 prints one table for the job, the latency and
bandwidth measured within each node and between nodes, and every problem
found. The exit status is 1 when a problem would make training fail or
crawl, on every rank.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

from torch_mojo import launcher

MEASURE_TIMEOUT_S = 60


def parse(argv):
    from torch_mojo.bench import parse_size

    parser = argparse.ArgumentParser(prog="torch-mojo doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2,
                        help="ranks to start on this machine when not run under a launcher (default 2)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--size", type=parse_size, default=16 << 20,
                        help="bytes of the bandwidth measurements and the all-reduce (default 16M)")
    parser.add_argument("--timeout", type=float, default=MEASURE_TIMEOUT_S,
                        help=f"seconds a measurement may take before the job is ended (default {MEASURE_TIMEOUT_S})")
    return parser.parse_args(argv)


def under_launcher() -> bool:
    return "RANK" in os.environ or launcher.launcher() is not None


def main(argv=None) -> int:
    args = parse(argv)
    if not under_launcher():
        return start_ranks(args.nproc, sys.argv[1:] if argv is None else argv)
    launcher.adopt_launcher_environment()
    return run_rank(args)


def start_ranks(nproc: int, argv: list[str]) -> int:
    """One node: `nproc` ranks of the doctor on this machine, as torchrun
    --standalone would start them; the status is the job's."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    processes = []
    for rank in range(nproc):
        environ = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                   "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        processes.append(subprocess.Popen([sys.executable, "-m", "torch_mojo.doctor", *argv], env=environ))
    return max(process.wait() for process in processes)


def bootstrap_timeout() -> float:
    from torch_mojo.env import BY_NAME

    return float(os.environ.get("MOJOCCL_BOOTSTRAP_TIMEOUT_S") or BY_NAME["MOJOCCL_BOOTSTRAP_TIMEOUT_S"].default)


def marker_path(cache: dict, node: str) -> str | None:
    """A file of this job and node in the cache directory: the other nodes
    look for it to tell whether they share the directory."""
    if not cache["writable"]:
        return None
    job = "/".join(os.environ.get(name, "") for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                                                          "SLURM_JOB_ID"))
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:16]  # noqa: E731
    return os.path.join(cache["path"], f".doctor-{digest(job)}-{digest(node)}")


def nodes_seen(nodes: list[str], mine: dict) -> list[str]:
    paths = {node: marker_path(mine["cache"], node) for node in nodes}
    return [node for node, path in paths.items() if path and os.path.exists(path)]


def run_rank(args) -> int:
    from torch_mojo.doctor import checks, job, report
    from torch_mojo.doctor.facts import gather

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = bootstrap_timeout()
    try:
        store = job.connect(timeout)
    except Exception as error:  # noqa: BLE001  what the store reports is the message
        print(f"torch-mojo doctor, rank {rank}: cannot reach the job's store at {os.environ['MASTER_ADDR']}:"
              f"{os.environ['MASTER_PORT']} within {timeout:.0f} s: {error}", file=sys.stderr)
        return 1
    mine = gather()
    marker = marker_path(mine["cache"], mine["node"])
    if marker:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        open(marker, "w").close()
    store.set(f"facts/{rank}", json.dumps(mine))
    try:
        if rank == 0:
            facts, missing = job.collect_facts(store, world_size, time.monotonic() + timeout)
            the_job = job.Job(facts, missing)
            found = checks.before_measurements(the_job, timeout)
            rounds = job.plan(facts) if checks.measurements_possible(found) else None
            nodes = sorted({each["node"] for each in facts.values()})
            store.set("plan", json.dumps({"rounds": rounds, "nodes": nodes}))
            if not args.json:
                print("\n".join(report.header_lines(the_job, world_size) + report.problem_lines(found)),
                      flush=True)
        else:
            answer = json.loads(job.wait_for(store, "plan", timeout + 30))
            rounds, nodes = answer["rounds"], answer["nodes"]
        store.set(f"seen/{rank}", json.dumps(nodes_seen(nodes, mine)))
        if rounds is not None:
            try:
                job.measure(store, rounds, rank, world_size, args.size, args.timeout)
            except Exception:  # noqa: BLE001  posted for rank 0 by measure()
                pass
        if rank == 0:
            return finish(store, the_job, rounds, found, world_size, args)
        status = int(job.wait_for(store, "verdict", timeout + args.timeout * 4))
        store.set(f"done/{rank}", "")  # rank 0 serves the store until every rank has read the verdict
        return status
    except TimeoutError as error:
        print(f"torch-mojo doctor, rank {rank}: {error}", file=sys.stderr)
        return 1
    finally:
        if marker and os.path.exists(marker):
            os.remove(marker)


def finish(store, the_job, rounds, found: list[dict], world_size: int, args) -> int:
    """Rank 0: the measurements' results and what they show, the report's
    end, and the exit status every rank returns."""
    from torch_mojo.doctor import checks, job, report

    if rounds is not None:
        job.results(store, the_job, rounds)
    seen_by = {rank: json.loads(store.get(f"seen/{rank}")) for rank in the_job.facts
               if store.check([f"seen/{rank}"])}
    later = checks.after_measurements(the_job, seen_by)
    problems = checks.ordered(found + later)
    status = 1 if any(item["severity"] == "error" for item in problems) else 0
    verdict = {"world_size": world_size, "problems": problems, "exit_status": status,
               "measured": rounds is not None}
    if args.json:
        print(json.dumps(report.summary(the_job, verdict), indent=2))
    else:
        lines = report.measurement_lines(the_job, args.size) if rounds is not None else \
            ["", "measurements skipped: fix the errors above first"]
        print("\n".join(lines + report.problem_lines(later) + report.verdict_lines(problems)))
    sys.stdout.flush()
    store.set("verdict", str(status))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(store.check([f"done/{rank}"]) for rank in the_job.facts if rank):
        time.sleep(0.05)
    return status
