"""Set-up past the ranks a machine's processes reach, and a model of it from
2 to 10,000 ranks.

The bootstrap rehearsed: n ranks, each a thread of one process
(mojocclRehearseBootstrap, nccl.h), join a root that runs in a process of
its own and make the exchanges a communicator across nodes makes (their
number and bytes read from a real 2-node communicator first; its
all-gathers as one of all their bytes: the same messages and bytes). At each n,
medians of --rounds:

  join      the slowest rank, from a common start to the table of ranks in
            hand (hello, the root's answer, the tree, the table)
  set-up    the same, then every exchange
  root      the root process's CPU time per rank: its serial work, the one
            part of the bootstrap that grows with n on a single core
  message   the ranks' CPU time per message of an exchange (a rank sends
            two and receives two each exchange), from a run of the same
            exchanges without the all-gathers' bytes less the join's

The connections run on the loopback (MOJOCCL_SOCKET_IFNAME=lo): with every
rank on one host, thousands of closed connections would otherwise hold its
local ports for a minute. All n ranks share this machine's cores, so join
and set-up are the whole job's work: a model of this machine,
T(n) = a n + b n^2 (each rank's own work, and the bytes of the table and
the all-gathers, which every rank receives whole), is fitted to them and
checked at every n.

The model of a cluster (a core per rank, nodes of --per-node ranks) is
built from the same measurements and from a run of setup_time.py across
simulated nodes (--nodes-file):

  T(n) = fabric + t0 + n t_root + R 2 h(n) 9 t_msg + h(n) 8 n (G + 208) / bw
         + (nodes - 1) 2 t_connect

fabric: a process's libfabric load (the fewest nodes'); t0: the rest of a
2-node set-up; t_root, t_msg: measured here; R exchanges of G all-gathered
bytes a rank; h(n): the tree's height (fan-out 8); bw: what a rank's host
sends per second (an assumption: 12.5 GB/s); t_connect: each node leader's
cost per connection to another leader (the peer watch's full mesh, two
channels), the slope of the peer-watch phase across simulated nodes.

    python benchmarks/setup_simulated.py [--ranks 64,256,1024,2048,4096] [--rounds 3]
                                         [--nodes-file benchmarks/results/setup-nodes.txt] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from setup_time import PHASES, one_run, slowest  # noqa: E402

TABLE_ENTRY = 208  # bytes of a rank's line in the table of ranks (RankInfo, base/bootstrap.h)
FAN_OUT = 8  # the bootstrap's tree (base/bootstrap_wire.h)
CHANNELS = 2  # connections between two node leaders: the watch and the frames (transports/peer_watch.h)
MODEL_RANKS = (2, 32, 128, 1024, 4096, 10000)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def serve_as_root() -> None:
    """Makes the unique id (its root thread listens here), prints it, and
    once told on stdin that the ranks are done, the CPU time it took."""
    from torch_mojo.mojoccl import Library

    library = Library()
    before = cpu_seconds()
    print(library.unique_id().hex(), flush=True)
    sys.stdin.readline()
    print(cpu_seconds() - before, flush=True)


def rehearse(ranks: int, exchanges: int, gathers: int, gather_bytes: int) -> dict:
    from torch_mojo.mojoccl import Library

    library = Library()
    root = subprocess.Popen([sys.executable, __file__, "--serve-as-root"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        uid = bytes.fromhex(root.stdout.readline().strip())
        before = cpu_seconds()
        results = library.rehearse_bootstrap(uid, ranks, range(ranks), exchanges, gathers, gather_bytes)
        ranks_cpu = cpu_seconds() - before
        root.stdin.write("done\n")
        root.stdin.flush()
        root_cpu = float(root.stdout.readline())
    finally:
        root.wait(timeout=60)
    failed = [message for _, status, message in results if status != 0]
    if failed:
        raise SystemExit(f"{len(failed)} of {ranks} rehearsed ranks failed: {failed[0]}")
    return {"seconds": max(seconds for seconds, _, _ in results), "ranks_cpu": ranks_cpu, "root_cpu": root_cpu}


def tree_height(ranks: int) -> int:
    """The levels below rank 0 of the bootstrap's tree: a rank heads itself
    and up to 8 runs, so a tree h levels deep holds (8^(h+1) - 1) / 7 ranks."""
    height = 0
    while (FAN_OUT ** (height + 1) - 1) // (FAN_OUT - 1) < ranks:
        height += 1
    return height


def fit_machine(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of T(n) = a n + b n^2, weighted so that every point
    counts alike (relative error)."""
    sxx = sum((n / t) ** 2 for n, t in points)
    sxy = sum((n / t) * (n * n / t) for n, t in points)
    syy = sum((n * n / t) ** 2 for n, t in points)
    sx1 = sum(n / t for n, t in points)
    sy1 = sum(n * n / t for n, t in points)
    determinant = sxx * syy - sxy * sxy
    return (sx1 * syy - sy1 * sxy) / determinant, (sy1 * sxx - sx1 * sxy) / determinant


def nodes_measured(path: str) -> dict:
    """From a setup_time.py run across simulated nodes of one rank: the
    fabric phase at the fewest nodes, the rest of that set-up, and the peer
    watch's cost per leader connection (its slope over the nodes)."""
    rows = []
    for line in open(path).read().split("\n\n")[1].splitlines()[1:]:
        fields = line.split()
        phases = dict(zip(PHASES, map(float, fields[8:8 + len(PHASES)])))
        rows.append((int(fields[0]), float(fields[7]), phases))
    nodes, library, phases = rows[0]
    xs = [(n - 1) * CHANNELS for n, _, _ in rows]
    ys = [p["peer watch"] for _, _, p in rows]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return {"fabric": phases["fabric"] / 1e3, "t0": (library - phases["fabric"]) / 1e3, "t_connect": slope / 1e3,
            "fewest": nodes}


def cluster_model(costs: dict, exchanges: int, gather_bytes: int, per_node: int, bandwidth: float):
    def predict(ranks: int) -> dict:
        nodes = max(1, -(-ranks // per_node))
        height = tree_height(ranks)
        terms = {
            "root": ranks * costs["t_root"],
            "tree": exchanges * 2 * height * (FAN_OUT + 1) * costs["t_msg"],
            "bytes": height * FAN_OUT * ranks * (gather_bytes + TABLE_ENTRY) / bandwidth,
            "mesh": (nodes - 1) * CHANNELS * costs["t_connect"],
        }
        return {"whole": costs["fabric"] + costs["t0"] + sum(terms.values()), **terms}

    return predict


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="64,256,1024,2048,4096")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes-file", default=os.path.join(HERE, "results", "setup-nodes.txt"))
    parser.add_argument("--per-node", type=int, default=4, help="ranks per node in the cluster's model")
    parser.add_argument("--bandwidth", type=float, default=12.5e9, help="bytes a second a rank's host sends")
    parser.add_argument("--output")
    parser.add_argument("--serve-as-root", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_as_root:
        return serve_as_root()
    # Every rank's connections start and end on this host: on the loopback
    # a closed connection's local port can be taken again at once.
    os.environ.setdefault("MOJOCCL_SOCKET_IFNAME", "lo")

    real = slowest(one_run("library", "mojo", 2, 1))  # a communicator across 2 simulated nodes
    exchanges, gather_bytes = real["rounds"], real["traffic"]
    gathers = 1 if exchanges > 0 else 0  # the set-up's all-gathers as one: the same messages and bytes
    lines = [f"the bootstrap rehearsed: n ranks as threads of one process, a root in another; "
             f"{exchanges} exchanges (one all-gather of {gather_bytes} bytes a rank, the rest comparisons), "
             f"as a 2-node communicator made them; median of {args.rounds}", "",
             f"{'ranks':>6}  {'join':>9}  {'set-up':>9}  {'root/rank':>9}  {'cpu/message':>11}  "
             f"{'model here':>10}  {'measured/model':>14}"]
    points, rows, roots, messages = [], [], [], []
    for ranks in [int(n) for n in args.ranks.split(",")]:
        runs = {"join": [], "messages": [], "set-up": []}
        for _ in range(args.rounds):
            runs["join"].append(rehearse(ranks, 0, 0, 0))
            runs["messages"].append(rehearse(ranks, exchanges, gathers, 0))
            runs["set-up"].append(rehearse(ranks, exchanges, gathers, gather_bytes))
        median = {(kind, what): statistics.median(run[what] for run in runs[kind])
                  for kind in runs for what in ("seconds", "ranks_cpu", "root_cpu")}
        join, full = median["join", "seconds"], median["set-up", "seconds"]
        root = median["set-up", "root_cpu"] / ranks
        per_message = (median["messages", "ranks_cpu"] - median["join", "ranks_cpu"]) / (ranks * exchanges * 4)
        rows.append((ranks, join, full, root, per_message))
        roots.append(root)
        messages.append(per_message)
        points.append((ranks, full))
        print(rows[-1], flush=True)
    a, b = fit_machine(points)
    for ranks, join, full, root, per_message in rows:
        model = a * ranks + b * ranks * ranks
        lines.append(f"{ranks:>6}  {join * 1e3:>6.1f} ms  {full * 1e3:>6.1f} ms  {root * 1e6:>6.1f} us  "
                     f"{per_message * 1e6:>8.1f} us  {model * 1e3:>7.1f} ms  {full / model:>13.2f}x")
    lines += ["", f"model of this machine: T(n) = a n + b n^2, a {a * 1e6:.1f} us, b {b * 1e9:.2f} ns "
                  f"(n^2 ({gather_bytes} + {TABLE_ENTRY}) bytes: {b / (gather_bytes + TABLE_ENTRY) * 1e12:.1f} ps a byte)"]

    measured = nodes_measured(args.nodes_file)
    costs = {**measured, "t_root": max(roots), "t_msg": max(messages)}
    predict = cluster_model(costs, exchanges, gather_bytes, args.per_node, args.bandwidth)
    lines += ["", f"model of a cluster, nodes of {args.per_node} ranks, a core per rank:",
              f"  T(n) = fabric + t0 + n t_root + R 2 h(n) 9 t_msg + h(n) 8 n (G + {TABLE_ENTRY}) / bw "
              f"+ (nodes - 1) {CHANNELS} t_connect",
              f"  fabric {costs['fabric'] * 1e3:.1f} ms, t0 {costs['t0'] * 1e3:.1f} ms and t_connect "
              f"{costs['t_connect'] * 1e6:.0f} us from {os.path.basename(args.nodes_file)}; t_root "
              f"{costs['t_root'] * 1e6:.1f} us and t_msg {costs['t_msg'] * 1e6:.1f} us the largest measured above; "
              f"R {exchanges}, G {gather_bytes}; bw {args.bandwidth / 1e9:g} GB/s (assumed)",
              f"{'ranks':>8}  {'height':>6}  {'root':>9}  {'tree':>9}  {'bytes':>9}  {'mesh':>9}  {'whole':>9}"]
    for ranks in MODEL_RANKS:
        terms = predict(ranks)
        lines.append(f"{ranks:>8}  {tree_height(ranks):>6}  " +
                     "  ".join(f"{terms[name] * 1e3:>6.1f} ms" for name in ("root", "tree", "bytes", "mesh")) +
                     f"  {terms['whole']:>7.3f} s")
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w") as out:
            out.write(text)
    print(text)


if __name__ == "__main__":
    main()
