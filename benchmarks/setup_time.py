"""How long a job takes to set up, as ranks grow: every rank's imports and
register_mojo_devices() done (across nodes, as its LOCAL_WORLD_SIZE says,
that starts loading libfabric in the background), the time from a common
start to the end of the first all_reduce, slowest rank, median over rounds
(the backends alternating in each round).

  torch     a TCPStore client (its server runs in the launcher, as
            torchrun's agent runs it), init_process_group on it, a first
            all_reduce of one float: `mojo` against gloo.
  library   libmojoccl alone (ctypes, the unique id through the store): the
            slowest rank's ncclCommInitRank, phase by phase as it reports
            them (mojocclCommSetupSeconds): the bootstrap (meeting the root,
            the table of ranks), the node's shared memory, the settings all
            ranks share, the fabric endpoint and addresses, the peer watch.

Layouts: one node, and simulated nodes of --per-node ranks (MOJOCCL_HOSTID,
libfabric's tcp provider between them). On a 2-core machine 32 ranks share
two cores: the times are those of an oversubscribed machine, and what they
show is how each part grows, not what a cluster's nodes would take.

    python benchmarks/setup_time.py [--ranks 2,4,8,16,32] [--per-node 1] [--rounds 3] [--output FILE]

benchmarks/setup_simulated.py goes past 32 ranks and models set-up to 10,000.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

PHASES = ("bootstrap", "shared memory", "settings", "fabric", "peer watch")


def free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


def wait_for_the_start(folder: str, rank: int) -> float:
    """Says this rank is ready, then waits for the common start time."""
    open(os.path.join(folder, f"ready.{rank}"), "w").close()
    go = os.path.join(folder, "go")
    while not os.path.exists(go):
        time.sleep(0.001)
    start = float(open(go).read())
    while time.time() < start:
        time.sleep(0.0005)
    return start


def run_rank(args) -> None:
    import torch
    import torch.distributed as dist

    import torch_mojo
    from torch_mojo.mojoccl import Library

    torch_mojo.register_mojo_devices()

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    library = Library() if args.kind == "library" else None
    start = wait_for_the_start(args.folder, rank)
    store = dist.TCPStore("127.0.0.1", args.port, size, False, use_libuv=True)
    stored = time.time()
    result = {"rank": rank, "store": stored - start}
    if args.kind == "torch":
        dist.init_process_group(args.backend, store=store, rank=rank, world_size=size)
        initialised = time.time()
        dist.all_reduce(torch.ones(1))
        result.update(init=initialised - stored, first=time.time() - initialised, total=time.time() - start)
        dist.destroy_process_group()
    else:
        if rank == 0:
            store.set("id", library.unique_id())
        uid = store.get("id")
        began = time.time()
        comm = library.init(size, uid, rank)
        rounds, traffic = library.setup_traffic(comm)
        result.update(init=time.time() - began, phases=library.setup_seconds(comm), rounds=rounds, traffic=traffic,
                      total=time.time() - start)
        store.add("done", 1)
        while store.add("done", 0) < size:  # none tears down while others still set up
            time.sleep(0.001)
        library.destroy(comm)
    print(json.dumps(result), flush=True)


def one_run(kind: str, backend: str, ranks: int, per_node: int) -> list[dict]:
    """Starts `ranks` processes, lets them import, starts them together.
    The store's server runs here, as torchrun's agent runs it."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        server = dist.TCPStore("127.0.0.1", port, ranks, True, wait_for_workers=False, use_libuv=True)  # noqa: F841
        processes = []
        for rank in range(ranks):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(ranks), TORCH_MOJO_BACKEND_TRACE="0",
                       OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE=str(per_node or ranks))
            if per_node:
                env["MOJOCCL_HOSTID"] = f"node{rank // per_node}"
            processes.append(subprocess.Popen(
                [sys.executable, __file__, "--rank-of", kind, "--backend", backend, "--port", str(port),
                 "--folder", folder], env=env, stdout=subprocess.PIPE, text=True))
        while len([name for name in os.listdir(folder) if name.startswith("ready.")]) < ranks:
            time.sleep(0.01)
        with open(os.path.join(folder, "go.tmp"), "w") as go:
            go.write(str(time.time() + 0.5))
        os.rename(os.path.join(folder, "go.tmp"), os.path.join(folder, "go"))
        results = []
        for process in processes:
            out, _ = process.communicate(timeout=300)
            if process.returncode != 0:
                raise SystemExit(f"a rank of {kind} {backend} at {ranks} ranks failed")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results


def slowest(results: list[dict]) -> dict:
    return max(results, key=lambda result: result["total"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4,8,16,32")
    parser.add_argument("--per-node", type=int, default=0, help="ranks per simulated node (0: one node)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output")
    parser.add_argument("--rank-of", dest="kind", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="mojo", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kind:
        return run_rank(args)
    layout = f"simulated nodes of {args.per_node} rank(s)" if args.per_node else "one node"
    lines = [f"set-up time, {layout}: slowest rank, median of {args.rounds} rounds (ms)",
             "mojo's store, init and first: the slowest rank's TCPStore connection, init_process_group",
             "and first all_reduce; library: libmojoccl's ncclCommInitRank alone, then its phases", ""]
    header = (f"{'ranks':>5}  {'mojo':>7}  {'gloo':>7}  {'gloo/mojo':>9}  {'store':>6}  {'init':>6}  {'first':>6}  "
              f"{'library':>7}  " + "  ".join(f"{phase:>13}" for phase in PHASES))
    lines.append(header)
    points = []
    for ranks in [int(n) for n in args.ranks.split(",")]:
        times = {"mojo": [], "gloo": [], "library": [], "store": [], "init": [], "first": []}
        phases, traffic = [], (0, 0)
        for _ in range(args.rounds):
            for backend in ("mojo", "gloo"):
                run = slowest(one_run("torch", backend, ranks, args.per_node))
                times[backend].append(run["total"])
                if backend == "mojo":
                    for part in ("store", "init", "first"):
                        times[part].append(run[part])
            library = slowest(one_run("library", "mojo", ranks, args.per_node))
            times["library"].append(library["init"])
            phases.append(library["phases"])
            traffic = (library["rounds"], library["traffic"])
        medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
        phase_medians = [statistics.median(round_[i] for round_ in phases) * 1e3 for i in range(len(PHASES))]
        line = (f"{ranks:>5}  {medians['mojo']:>7.1f}  {medians['gloo']:>7.1f}  "
                f"{medians['gloo'] / medians['mojo']:>8.2f}x  {medians['store']:>6.1f}  {medians['init']:>6.1f}  "
                f"{medians['first']:>6.1f}  {medians['library']:>7.1f}  " +
                "  ".join(f"{value:>13.1f}" for value in phase_medians))
        lines.append(line)
        print(line, flush=True)
    lines += ["", f"exchanges over the bootstrap's tree after the table: {traffic[0]}; "
                  f"bytes a rank put into their all-gathers: {traffic[1]}"]
    if args.output:
        with open(args.output, "w") as out:
            out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
