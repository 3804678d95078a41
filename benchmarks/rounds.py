"""Medians over rounds of `torch-mojo bench` runs: each CSV given is one
round (one run, in which every backend ran side by side); for each label
(the part of the file name before "-round"), collective, size and backend
it prints the median time over the rounds and their spread, then each
mojo backend's ratio to MPI's median (above 1: faster than Open MPI).
A run without MPI (under torchrun) names the label whose MPI rows it is
compared with after "-vs-": "1x1-torchrun-vs-1x1-frames-on-socket-round1".

    python benchmarks/rounds.py out/small-1x1-sockets-round*.csv out/small-1x1-fabric-round*.csv
"""

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(paths):
    times = defaultdict(list)  # (label, collective, size, backend) -> [us per round]
    compared_with = {}  # label -> the label whose MPI rows it is compared with
    for path in paths:
        stem = Path(path).stem.split("-round")[0]
        compared_with[stem.split("-vs-")[0]] = stem.split("-vs-")[-1]
        label = Path(path).stem.split("-round")[0].split("-vs-")[0]
        with open(path, newline="") as file:
            for row in csv.DictReader(file):
                times[label, row["collective"], int(row["size_bytes"]), row["backend"]].append(float(row["time_us"]))
    rows = sorted({key[:3] for key in times}, key=lambda key: (key[1], key[0], key[2]))
    print(f"# median over rounds (spread), us; ratio: MPI's median / this one's")
    print(f"{'label':24s} {'collective':15s} {'bytes':>9s}  {'backend':12s} {'median':>9s}  {'spread':17s} {'vs MPI':>6s}")
    for label, collective, size in rows:
        mpi = times.get((compared_with[label], collective, size, "mpi"))
        for backend in sorted(b for (l, c, s, b) in times if (l, c, s) == (label, collective, size)):
            values = times[label, collective, size, backend]
            median = statistics.median(values)
            ratio = f"{statistics.median(mpi) / median:.2f}x" if mpi and backend != "mpi" else ""
            print(f"{label:24s} {collective:15s} {size:9d}  {backend:12s} {median:9.1f}  "
                  f"({min(values):.1f}-{max(values):.1f})".ljust(78) + f" {ratio:>6s}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
