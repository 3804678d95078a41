"""How long a job takes to set up, as ranks grow: every rank's imports
done, the time from a common start to the end of the first all_reduce,
slowest rank, median over rounds (the backends alternating in each round).

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
    python benchmarks/setup_time.py --model-from FILE    # the model of a recorded run, again
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

PHASES = ("bootstrap", "shared memory", "settings", "fabric", "peer watch")
TABLE_ENTRY = 208  # bytes of a rank's line in the bootstrap's table (RankInfo, base/bootstrap.h)
MODEL_RANKS = (32, 128, 1024, 4096, 10000)


def model(points: list[tuple[int, float, float]], rounds: int, traffic: int, bandwidth: float):
    """Fits T(n) = t0 + n (rounds + 1) t_rank + n^2 (traffic + a table
    line) / bandwidth to the measured (ranks, seconds, of which the fabric
    phase): the root of the bootstrap takes each rank's part of every
    exchange in turn (t_rank each), then sends every rank all n parts;
    `bandwidth`: what the root's host sends per second. The fabric phase is
    mostly each process loading libfabric, side by side on a cluster's nodes
    (here the ranks share 2 cores): left out of the fit, and added as the
    fewest ranks' value. Returns t0, t_rank and a predictor."""
    per_rank = traffic + TABLE_ENTRY
    rows = [(n * (rounds + 1), seconds - fabric - n * n * per_rank / bandwidth) for n, seconds, fabric in points]
    count, sx, sy = len(rows), sum(x for x, _ in rows), sum(y for _, y in rows)
    sxx, sxy = sum(x * x for x, _ in rows), sum(x * y for x, y in rows)
    t_rank = max((count * sxy - sx * sy) / (count * sxx - sx * sx), 0.0)
    t0 = max((sy - t_rank * sx) / count, 0.0)
    fabric = min(points)[2]

    def predict(n):
        gather = n * n * per_rank / bandwidth
        return fabric + t0 + n * (rounds + 1) * t_rank + gather, gather

    return t0, t_rank, predict


def model_lines(points, rounds: int, traffic: int, bandwidth: float) -> list[str]:
    t0, t_rank, predict = model(points, rounds, traffic, bandwidth)
    fabric = min(points)[2]
    lines = [f"model of libmojoccl's set-up: T(n) = fabric + t0 + n ({rounds} + 1) t_rank + n^2 ({traffic} + "
             f"{TABLE_ENTRY}) B / {bandwidth / 1e9:g} GB/s; fabric {fabric * 1e3:.1f} ms (the fewest ranks'), "
             f"fitted t0 {t0 * 1e3:.2f} ms, t_rank {t_rank * 1e6:.1f} us",
             "(measured: its fabric phase, then the rest; model: the rest, then the whole)",
             f"{'ranks':>6}  {'fabric':>9}  {'the rest':>9}  {'model: rest':>11}  {'whole':>9}  {'root sending':>12}"]
    measured = {n: (seconds, fabric) for n, seconds, fabric in points}
    for n in sorted(set(measured) | set(MODEL_RANKS)):
        total, gather = predict(n)
        seconds, fabric = measured.get(n, (None, None))
        seen = f"{fabric * 1e3:>6.1f} ms  {(seconds - fabric) * 1e3:>6.1f} ms" if seconds else f"{'':>9}  {'':>9}"
        lines.append(f"{n:>6}  {seen}  {(total - min(points)[2]) * 1e3:>8.1f} ms  {total:>7.3f} s  "
                     f"{gather / total:>11.0%}")
    return lines


def model_from(path: str, bandwidth: float) -> list[str]:
    """The model, from a recorded run's table (its rounds and bytes from its model line)."""
    text = open(path).read()
    table = text.split("\nmodel of")[0]
    rounds, traffic = (int(value) for value in
                       re.search(r"n \((\d+) \+ 1\) t_rank \+ n\^2 \((\d+) \+", text).groups())
    points = []
    for line in table.splitlines():
        fields = line.split()
        if fields and fields[0].isdigit():
            points.append((int(fields[0]), float(fields[7]) / 1e3, float(fields[11]) / 1e3))
    return table.rstrip("\n").splitlines() + [""] + model_lines(points, rounds, traffic, bandwidth)


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
        while store.add("done", 0) < size:  # the root serves until every rank has set up
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
                       OMP_NUM_THREADS="1")
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
    parser.add_argument("--root-bandwidth", type=float, default=12.5e9,
                        help="bytes per second the bootstrap root's host sends, for the model (12.5e9: 100 Gb/s)")
    parser.add_argument("--model-from", metavar="FILE", help="print (and rewrite in FILE) the model of a recorded run")
    parser.add_argument("--rank-of", dest="kind", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="mojo", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kind:
        return run_rank(args)
    if args.model_from:
        lines = model_from(args.model_from, args.root_bandwidth)
        with open(args.model_from, "w") as out:
            out.write("\n".join(lines) + "\n")
        return print("\n".join(lines))
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
        points.append((ranks, medians["library"] / 1e3, phase_medians[3] / 1e3))
    lines += [""] + model_lines(points, *traffic, args.root_bandwidth)
    if args.output:
        with open(args.output, "w") as out:
            out.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
