"""What `torch-mojo bench` prints and writes: its tables, the .csv of every
measurement and the plot of bus bandwidth by size."""

from __future__ import annotations

import csv

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]


def human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def write_csv(rows, path):
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def pyplot(path):
    """matplotlib's pyplot, drawing to files; None (said so) where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"# matplotlib is not installed: no {path}", flush=True)
        return None
    return plt


def write_outputs(rows, prefix, world):
    write_csv(rows, prefix + ".csv")
    plt = pyplot(prefix + ".png")
    if plt is None:
        return
    collectives = sorted({row["collective"] for row in rows}, key=COLLECTIVES.index)
    figure, axes = plt.subplots(1, len(collectives), figsize=(4.2 * len(collectives), 3.6), squeeze=False)
    for axis, collective in zip(axes[0], collectives):
        for backend in dict.fromkeys(row["backend"] for row in rows):
            points = [(row["size_bytes"], row["busbw_GBps"]) for row in rows
                      if row["collective"] == collective and row["backend"] == backend]
            if points:
                axis.plot(*zip(*points), marker="o", label=backend)
        axis.set_xscale("log", base=2)
        axis.set_title(f"{collective}, {world} ranks")
        axis.set_xlabel("size (bytes)")
        axis.set_ylabel("busbw (GB/s)")
        axis.grid(True, alpha=0.3)
    axes[0][0].legend()
    figure.tight_layout()
    figure.savefig(prefix + ".png", dpi=110)


def print_table(collective, sizes, results, backends, world):
    baselines = [name for name in ("gloo", "mpi", "p2p", "wire") if name in backends]
    header = f"{'size':>9} {'count':>10} {'type':>7} {'redop':>5}"
    for name in backends:
        header += f" | {name:>8}: {'time(us)':>9} {'busbw':>7} {'#wrong':>6}"
    for base in baselines:
        for name in backends:
            if name not in baselines:
                header += f" | {name}/{base:<4}"
    print(f"\n# {collective}, {world} ranks, float32; busbw in GB/s")
    print(header)
    for size in sizes:
        line = f"{size:>9} {size // 4:>10} {'float':>7} {'sum' if 'reduce' in collective else 'none':>5}"
        for name in backends:
            seconds, busbw, wrong = results[(name, size)]
            line += f" | {'':>8}  {seconds * 1e6:>9.1f} {busbw:>7.2f} {wrong:>6}"
        for base in baselines:
            for name in backends:
                if name not in baselines:
                    ratio = results[(name, size)][1] / max(results[(base, size)][1], 1e-12)
                    line += f" | {ratio:>{len(name) + len(base) + 1}.1f}x"
        print(line, flush=True)
