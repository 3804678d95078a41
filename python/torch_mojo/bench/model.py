"""`torch-mojo bench --model`: libmojoccl's cost model of the all-reduce
between nodes, from 2 to 1024 nodes, each algorithm's predicted time and
the one it chooses, next to what bench runs measured; nothing runs."""

from __future__ import annotations

import csv

from torch_mojo.bench.report import human, pyplot

# Powers of two, where Rabenseifner's algorithm needs no extra steps, and
# counts between them, where it does and the tree does not.
MODEL_NODES = [2, 4, 6, 8, 12, 16, 32, 48, 64, 128, 256, 512, 1024]
NETWORK_ALGORITHMS = ["ring", "recursive_doubling", "rabenseifner", "tree"]
FRAME_BYTES = 64 << 10  # up to this, an all-reduce between nodes is one exchange of frames, outside the model


def measured_times(paths: str) -> dict[tuple[int, int], float]:
    """(ranks, bytes) -> microseconds of mojo+fabric all_reduce in bench .csv files."""
    times = {}
    for path in filter(None, paths.split(",")):
        with open(path, newline="") as file:
            for row in csv.DictReader(file):
                if row["backend"] == "mojo+fabric" and row["collective"] == "all_reduce":
                    times[(int(row["ranks"]), int(row["size_bytes"]))] = float(row["time_us"])
    return times


def print_model(sizes: list[int], measured_paths: str, output: str):
    from torch_mojo.mojoccl import Library

    library = Library()
    measured = measured_times(measured_paths)
    sizes = [size for size in sizes if size > FRAME_BYTES]
    chosen_times = {}
    print("# all_reduce between nodes (one leader each): the cost model's time in us per algorithm, its choice "
          "(MOJOCCL_NET_ALGO), and what mojo+fabric measured")
    print(f"{'nodes':>6} {'size':>6} {'ring':>10} {'rec.doubl.':>10} {'rabenseif.':>10} {'tree':>10}  {'chosen':<19} "
          f"{'measured':>9}")
    for nodes in MODEL_NODES:
        for size in sizes:
            predicted = [library.predict_all_reduce(nodes, size, name)[1] * 1e6 for name in NETWORK_ALGORITHMS]
            chosen = library.predict_all_reduce(nodes, size)[0]
            seen = measured.get((nodes, size))
            chosen_times[(nodes, size)] = predicted[NETWORK_ALGORITHMS.index(chosen)]
            columns = "".join(f"{time:>10.0f} " for time in predicted)
            print(f"{nodes:>6} {human(size):>6} {columns} {chosen:<19} {f'{seen:.0f}' if seen is not None else '':>9}")
    plot_model(sizes, chosen_times, measured, output + "-model.png")


def plot_model(sizes, chosen_times, measured, path):
    """The model's time (its chosen algorithm) against the node count, a
    line per size, with what was measured as points of the same colour."""
    plt = pyplot(path)
    if plt is None:
        return
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for size in sizes:
        line, = axis.plot(MODEL_NODES, [chosen_times[(nodes, size)] for nodes in MODEL_NODES], marker=".",
                          label=f"{human(size)} (model)")
        seen = sorted((nodes, time) for (nodes, at), time in measured.items() if at == size)
        if seen:
            axis.plot(*zip(*seen), "o", color=line.get_color(), markersize=8, fillstyle="none",
                      label=f"{human(size)} (measured)")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("nodes (one leader each)")
    axis.set_ylabel("all_reduce time (us)")
    axis.set_title("all_reduce between nodes: the cost model and measurements")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"# wrote {path}")
