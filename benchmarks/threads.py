"""Training time against torch's thread count: mojo and gloo, one machine.

torchrun sets OMP_NUM_THREADS=1 where it is unset; mp.spawn, Lightning's
launcher and a plain srun leave torch's default, one thread per core in
every rank. This runs examples/train_fsdp2.py and examples/gpt_ddp.py
under torchrun and under mp.spawn at OMP_NUM_THREADS 1, 2 and unset, on
mojo and on gloo in alternation, and prints the median wall time of each
(launch to exit) and mojo's speed relative to gloo's.

    .venv/bin/python benchmarks/threads.py [--rounds 3] [--nproc 2] [--output DIR]
"""

import argparse
import csv
import os
import runpy
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOBS = {
    "train_fsdp2": ["examples/train_fsdp2.py", "--steps", "100"],
    "gpt_ddp": ["examples/gpt_ddp.py", "--steps", "100", "--eval-every", "1000"],
}
THREADS = ["1", "2", "unset"]
LAUNCHERS = ["torchrun", "mp.spawn"]
BACKENDS = ["mojo", "gloo"]


def spawned_rank(rank, nproc, port, script, args):
    """One rank under mp.spawn: the environment torchrun would give it."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")


def spawn(nproc, port, script, args):
    import torch.multiprocessing as mp

    mp.spawn(spawned_rank, args=(nproc, port, script, args), nprocs=nproc)


def command(launcher, nproc, port, job, backend):
    script, *args = JOBS[job]
    args = [*args, "--backend", backend]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                f"--master-port={port}", script, *args]
    return [sys.executable, __file__, "--spawn", str(nproc), str(port), script, *args]


# gloo's own abort at exit (docs/troubleshooting.md): the run is timed again.
GLOO_EXIT_ABORT = "terminate called without an active exception"


def timed_run(argv, threads, tries=3):
    env = dict(os.environ, TORCH_MOJO_BACKEND_TRACE="0")
    env.pop("OMP_NUM_THREADS", None)
    if threads != "unset":
        env["OMP_NUM_THREADS"] = threads
    for _ in range(tries):
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - start
        if done.returncode == 0:
            return seconds
        if GLOO_EXIT_ABORT not in done.stderr:
            break
    raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--spawn":
        nproc, port, script, *args = sys.argv[2:]
        return spawn(int(nproc), int(port), script, args)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None, help="also write DIR/threads.csv")
    options = parser.parse_args()

    print(f"{options.nproc} ranks on {len(os.sched_getaffinity(0))} CPUs, median of {options.rounds} "
          "rounds, mojo and gloo alternating; seconds from launch to exit")
    print(f"{'job':<12} {'launcher':<9} {'threads':<7} {'mojo s':>7} {'gloo s':>7} {'mojo/gloo speed':>16}")
    rows = []
    port = 29620
    for job in JOBS:
        for launcher in LAUNCHERS:
            for threads in THREADS:
                times = {backend: [] for backend in BACKENDS}
                for _ in range(options.rounds):
                    for backend in BACKENDS:
                        port += 1
                        times[backend].append(timed_run(
                            command(launcher, options.nproc, port, job, backend), threads))
                mojo, gloo = (statistics.median(times[b]) for b in BACKENDS)
                rows.append([job, launcher, threads, f"{mojo:.2f}", f"{gloo:.2f}", f"{gloo / mojo:.2f}"])
                print(f"{job:<12} {launcher:<9} {threads:<7} {mojo:7.2f} {gloo:7.2f} {gloo / mojo:15.2f}x",
                      flush=True)
    if options.output:
        options.output.mkdir(parents=True, exist_ok=True)
        with open(options.output / "threads.csv", "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["job", "launcher", "omp_num_threads", "mojo_s", "gloo_s", "mojo_speed_vs_gloo"])
            writer.writerows(rows)


if __name__ == "__main__":
    main()
