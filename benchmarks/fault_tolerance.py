"""torchft on `mojo` against torchft on gloo, in one run: the same script,
seeds and steps, the backends alternating round by round. `mojo` is
torch_mojo.torchft.ProcessGroupMojo (rebuilt at each quorum); where
torch-mojo is built with torchcomms, `mojo-torchcomms` is torchft's own
ProcessGroupTorchComms over a `mojo` communicator (reconfigured).

  steps      2 replica groups of 1 rank training examples/torchft/train_ddp.py
             (a gradient of WIDTH^2 + 3 WIDTH floats) with no extra work per
             step: the median time between committed steps, past the first
             STEADY_FROM (each step: torchft's quorum, the cross-replica
             all-reduce, should_commit's agreement).
  recovery   the same with 50 ms of work per step; replica group 1 SIGKILLed
             at its step KILL_AT: the seconds from the kill to the healthy
             group's first step committed alone, and to the restarted group's first
             (torchrun's restart, imports, torchft's Manager, the quorum, the
             weights sent over).
  quorum     torchft's configure() of a new quorum's group (the group torchft
             rebuilds at every quorum change) and a first 4-byte all-reduce,
             slowest rank, on two layouts: 2x2 (two replica groups of 2 ranks,
             each on a node of its own: two groups of 2 across the nodes, as
             torchft makes one per local rank) and 8 nodes of 1 rank. Nodes
             are MOJOCCL_HOSTID's, talking over libfabric's tcp provider;
             0.3 s pass between quorum changes (torchft's come steps apart).
             Each replica group has a store of its own, as torchrun gives it
             (MASTER_ADDR, MASTER_PORT).

    python benchmarks/fault_tolerance.py [--rounds 3] [--width 1024] [--output FILE]

Prints a table of medians over the rounds, with each round's values.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "torchft"))
from replicas import Replicas  # noqa: E402  (examples/torchft/replicas.py)

BACKENDS = ("mojo", *(["mojo-torchcomms"] if importlib.util.find_spec("torch_mojo._torchcomms") else []), "gloo")
STEADY_FROM = 20
KILL_AT = 30
# torchft changes its quorum where a group failed or joined, steps apart:
# the quorum benchmark trains (sleeps) this long between changes.
TRAINING_BETWEEN_QUORUMS = 0.3


def script_args(backend: str, steps: int, width: int, step_delay: float) -> list[str]:
    return ["--backend", backend, "--steps", str(steps), "--width", str(width), "--step-delay", str(step_delay),
            "--timeout", "5"]


def step_time(backend: str, width: int, steps: int = 200) -> float:
    """Median seconds between committed steps of replica 0, 2 groups."""
    with tempfile.TemporaryDirectory() as directory:
        run = Replicas(Path(directory), script_args(backend, steps, width, 0.0))
        try:
            run.wait([0, 1], timeout=600)
            times = [at for step, participants, at in run.committed(0) if step >= STEADY_FROM and participants == 2]
        finally:
            run.close()
    return statistics.median(later - earlier for earlier, later in zip(times, times[1:]))


def recovery(backend: str, width: int, steps: int = 120) -> tuple[float, float]:
    """(seconds from the kill to the healthy group's first step committed
    without the killed group, seconds from the kill to the restarted
    group's first committed step)."""
    with tempfile.TemporaryDirectory() as directory:
        run = Replicas(Path(directory), script_args(backend, steps, width, 0.05))
        try:
            run.wait_for_step(0, KILL_AT)
            run.wait_for_step(1, KILL_AT)
            killed = time.time()
            run.kill(1)
            run.wait([0, 1], timeout=600)
            # The step in flight at the kill may still commit with both groups
            # (the killed one had sent its part): the healthy group is going
            # on without the other once it commits a step alone.
            healthy = min(at for _, participants, at in run.committed(0) if at > killed and participants == 1)
            rejoined = min(at for _, _, at in run.committed(1) if at > killed)
        finally:
            run.close()
    return healthy - killed, rejoined - killed


def configure_worker(backend, rank, world, groups_of, port, replica_ports, quorums, barrier, results):
    """One rank of the quorum benchmark: `quorums` new quorums, each a
    configure() of its group (ranks with the same rank % groups_of, as
    torchft pairs the same local rank of every replica group) and a first
    all-reduce."""
    local, replica = rank % groups_of, rank // groups_of
    os.environ.update({"MOJOCCL_HOSTID": f"node{replica}", "MOJOCCL_FABRIC_PROVIDER": "tcp",
                       "TORCH_MOJO_BACKEND_TRACE": "0", "MASTER_ADDR": "localhost",
                       "MASTER_PORT": str(replica_ports[replica]), "RANK": str(local), "WORLD_SIZE": str(groups_of)})
    import torch
    from torchft import ProcessGroupGloo
    from torch_mojo.torchft import ProcessGroupMojo, process_group_through_torchcomms

    timeout = timedelta(seconds=30)
    group = {"mojo": ProcessGroupMojo, "mojo-torchcomms": process_group_through_torchcomms,
             "gloo": ProcessGroupGloo}[backend](timeout=timeout)
    size = world // groups_of
    tensor = torch.ones(1)
    taken = []
    for quorum in range(quorums):
        barrier.wait()
        started = time.perf_counter()
        group.configure(f"localhost:{port}/quorum{quorum}/local{local}", f"replica{replica}", replica, size, quorum)
        group.allreduce([tensor], torch.distributed.AllreduceOptions()).wait()
        taken.append(time.perf_counter() - started)
        time.sleep(TRAINING_BETWEEN_QUORUMS)
    group.abort()
    results.put((rank, taken))


def quorum_time(backend: str, nodes: int, ranks_per_node: int, quorums: int = 10) -> float:
    """Median over `quorums` of the slowest rank's configure() and first
    all-reduce, in seconds."""
    from torch.distributed import TCPStore

    world = nodes * ranks_per_node
    store = TCPStore("localhost", 0, world, is_master=True, wait_for_workers=False)  # torchft's
    replica_stores = [TCPStore("localhost", 0, is_master=True, wait_for_workers=False) for _ in range(nodes)]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(world), context.Queue()
    workers = [context.Process(target=configure_worker, args=(
        backend, rank, world, ranks_per_node, store.port, [each.port for each in replica_stores], quorums, barrier,
        results)) for rank in range(world)]
    for worker in workers:
        worker.start()
    taken = {}
    while len(taken) < world:
        try:
            rank, times = results.get(timeout=1)
            taken[rank] = times
        except queue.Empty:
            failed = [worker.exitcode for worker in workers if worker.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"{len(failed)} of the {backend} workers ended with {failed}") from None
    for worker in workers:
        worker.join()
    return statistics.median(max(taken[rank][quorum] for rank in taken) for quorum in range(1, quorums))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024, help="hidden units of train_ddp.py's model")
    parser.add_argument("--output", help="also write the table here")
    args = parser.parse_args()
    gradient = (args.width * args.width + 3 * args.width + 2) * 4
    values = {}
    for round_number in range(args.rounds):
        for backend in (BACKENDS if round_number % 2 == 0 else BACKENDS[::-1]):
            healthy, rejoined = recovery(backend, args.width)
            for name, value in (("step (ms)", step_time(backend, args.width) * 1e3),
                                ("kill -> healthy group's first step alone (s)", healthy),
                                ("kill -> restarted group's first step (s)", rejoined),
                                ("quorum 2x2: configure + first all-reduce (ms)", quorum_time(backend, 2, 2) * 1e3),
                                ("quorum 8 nodes: configure + first all-reduce (ms)",
                                 quorum_time(backend, 8, 1) * 1e3)):
                values.setdefault(name, {}).setdefault(backend, []).append(value)
        print(f"round {round_number + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    ours = [backend for backend in BACKENDS if backend != "gloo"]
    lines = [f"torchft, 2 replica groups, gradient {gradient / 1e6:.1f} MB (--width {args.width}); "
             f"medians of {args.rounds} rounds, backends alternating",
             f"{'':50} " + " ".join(f"{backend:>15}" for backend in BACKENDS) + " "
             + " ".join(f"{'gloo/' + backend:>20}" for backend in ours) + f"   rounds ({' | '.join(BACKENDS)})"]
    for name, by_backend in values.items():
        medians = {backend: statistics.median(by_backend[backend]) for backend in BACKENDS}
        rounds = " | ".join(" ".join(f"{value:.3g}" for value in by_backend[backend]) for backend in BACKENDS)
        lines.append(f"{name:50} " + " ".join(f"{medians[backend]:15.3g}" for backend in BACKENDS) + " "
                     + " ".join(f"{medians['gloo'] / medians[backend]:20.2f}" for backend in ours) + f"   {rounds}")
    print("\n".join(lines))
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
