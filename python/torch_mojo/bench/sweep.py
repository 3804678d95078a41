"""`torch-mojo bench`: nccl-tests-style tables, mojo against gloo and MPI.

Each rank runs this module; launch it with torchrun or with mpirun/srun:

    torch-mojo bench --nproc 2                         # starts torchrun itself
    torchrun --standalone --nproc-per-node=2 -m torch_mojo.bench
    mpirun -np 2 python -m torch_mojo.bench            # adds the MPI columns

With --model it prints, without running anything, libmojoccl's cost model
of the all-reduce between nodes (one leader each) from 2 to 1024 nodes:
each algorithm's predicted time and the one it chooses, next to what a
bench run measured (--measured: the .csv of runs of mojo+fabric), and
plots them (<output>-model.png).

With --kernels it measures instead, on every rank at once, the Mojo
reduction kernel against memcpy (GB/s counts bytes read plus written) and
derives the memory-traffic limit of a collective; with --ddp, training
steps per second of DistributedDataParallel (an MLP 1024-4096-1024, batch
64) on mojo, on mojo with its buckets in the pool, and on gloo.

For every collective and size it times, in the same processes and on the
same machine:
  mojo          dist.<collective> on a `mojo` process group (through torch)
  mojo+pool     the same, on tensors from the registered shared-memory pool
  mojo+fabric   dist.<collective> on a mojo group in which every rank stands
                for a node of its own (MOJOCCL_HOSTID): the libfabric path
                between nodes, with MOJOCCL_FABRIC_PROVIDER (default here:
                tcp, as one machine has no fabric NIC)
                (--ranks-per-node K: consecutive ranks share a node, K per node)
  p2p           point-to-point, in the same run: each rank swaps a message
                of the size with its partner on the next node (ncclSend and
                ncclRecv in one group of libmojoccl, no torch in between);
                "busbw" is the bytes one way per second, both ways busy
  wire          the provider's own point-to-point, in the same run: the
                same swap as one message each way posted straight on the
                fabric endpoint (mojocclWireSendRecv: no header, no copy)
  gloo          dist.<collective> on a gloo group over the same ranks
  mojoccl       libmojoccl's NCCL API called directly (the library alone)
  mojoccl+pool  the same, on ncclMemAlloc buffers
  mpi           mpi4py on the same buffers (when launched by MPI)

Times are the median over iterations of one call each, taken as the
slowest rank's median. Bandwidths follow nccl-tests: algbw = bytes / time,
busbw = algbw x the collective's factor (all-reduce 2(n-1)/n, all-gather,
reduce-scatter and all-to-all (n-1)/n, broadcast 1). "#wrong" counts the
elements of a checked run that differ from the expected result.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

from torch_mojo.bench.model import print_model
from torch_mojo.bench.report import COLLECTIVES, human, print_table, write_csv, write_outputs
from torch_mojo.bench.runners import (LibraryRunner, MpiRunner, PointToPointRunner, TorchRunner, WireRunner,
                                      group_across_nodes)

DEFAULT_SIZES = "8,64,512,4K,32K,256K,1M,4M,16M,64M,256M"
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


# ------------------------------------------------------------ measuring

def measure(runner, collective, count, min_seconds, max_iterations, agree):
    """Median seconds per call on this rank, and #wrong of a checked run.
    `agree(value)` returns the largest value over all ranks: every rank must
    run the same number of iterations."""
    send, recv = runner.buffers(collective, count)
    result = runner.run(collective, send, recv)  # checked run, from known inputs
    wrong = int((result != runner.expected(collective, count)).sum().item())
    warmup = []
    for _ in range(3):
        began = time.perf_counter()
        runner.run(collective, send, recv)
        warmup.append(time.perf_counter() - began)
    iterations = agree(int(min(max_iterations, max(5, min_seconds / max(min(warmup), 1e-7)))))
    runner.barrier()
    times = []
    for _ in range(iterations):
        began = time.perf_counter()
        runner.run(collective, send, recv)
        times.append(time.perf_counter() - began)
    return statistics.median(times), wrong


def over_ranks(value, gloo_group, world, pick=max):
    """`pick` of every rank's `value` (through gloo, outside what is measured)."""
    import torch.distributed as dist

    gathered = [None] * world
    dist.all_gather_object(gathered, value, group=gloo_group)
    return pick(gathered)


# ------------------------------------------------------------ workloads

def kernel_bandwidth(rank, world, gloo, sizes, min_seconds):
    """Mojo's reduction kernel (two inputs, float32 sum) against memcpy, on
    every rank at the same time: the memory system as collectives see it."""
    import ctypes

    import torch
    import torch.distributed as dist

    from torch_mojo._paths import library_dir

    kernels = ctypes.CDLL(os.path.join(library_dir(), "libtorch_mojo_kernels.so"))
    kernels.tm_reduce.restype = ctypes.c_int32
    kernels.tm_reduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_int32, ctypes.c_int32, ctypes.c_int64]
    rows = []
    for size in sizes:
        count = size // 4
        a, b, out = torch.ones(count), torch.ones(count), torch.empty(count)
        sources = (ctypes.c_void_p * 2)(a.data_ptr(), b.data_ptr())

        def copy():
            out.copy_(a)

        def reduce():
            kernels.tm_reduce(out.data_ptr(), ctypes.addressof(sources), 2, count, 7, 0, 1)

        for name, run, traffic in (("memcpy", copy, 2), ("mojo reduce", reduce, 3)):
            run()
            iterations = over_ranks(int(max(5, min(1000, min_seconds / max(_time_one(run), 1e-7)))), gloo, world)
            dist.barrier(group=gloo)
            times = [_time_one(run) for _ in range(iterations)]
            per_rank = traffic * size / statistics.median(times) / 1e9
            gathered = [None] * world
            dist.all_gather_object(gathered, per_rank, group=gloo)
            rows.append({"kernel": name, "size_bytes": size, "ranks": world,
                         "GBps_per_rank": round(min(gathered), 2), "GBps_all_ranks": round(sum(gathered), 2)})
    return rows


def _time_one(run):
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def ddp_steps(rank, world, gloo, repeats=5, steps=10):
    """DDP training steps per second; the three setups alternate, so that a
    noisy machine treats them alike."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_mojo.memory as shared

    def build(group):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
        return DDP(model, process_group=group), torch.optim.SGD(model.parameters(), lr=0.01)

    with shared.cpu_tensors_in_pool():
        pooled = build(None)
    setups = {"mojo": build(None), "mojo+pool": pooled, "gloo": build(gloo)}
    x, y = torch.randn(64, 1024), torch.randn(64, 1024)

    def run(model, optimizer, count):
        dist.barrier(group=gloo)
        began = time.perf_counter()
        for _ in range(count):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
        return count / (time.perf_counter() - began)

    for model, optimizer in setups.values():
        run(model, optimizer, 3)
    rates = {name: [] for name in setups}
    for _ in range(repeats):
        for name, (model, optimizer) in setups.items():
            rates[name].append(over_ranks(run(model, optimizer, steps), gloo, world, min))
    return {name: statistics.median(values) for name, values in rates.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="torch-mojo bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes; K/M/G suffixes allowed")
    parser.add_argument("--backends", default="mojo,mojo+pool,gloo,mojoccl,mojoccl+pool,mpi",
                        help="any of mojo, mojo+pool, mojo+fabric, p2p, wire, gloo, mojoccl, mojoccl+pool, mpi (mpi only "
                        "under MPI)")
    parser.add_argument("--ranks-per-node", type=int, default=1,
                        help="mojo+fabric and p2p: consecutive ranks that share a node")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="time per size and backend")
    parser.add_argument("--max-iterations", type=int, default=2000)
    parser.add_argument("--output", default="bench", help="prefix of the .csv and .png written by rank 0")
    parser.add_argument("--kernels", action="store_true", help="the reduction kernel against memcpy")
    parser.add_argument("--ddp", action="store_true", help="DDP training steps per second")
    parser.add_argument("--model", action="store_true", help="the cost model between nodes, 2 to 1024 nodes")
    parser.add_argument("--measured", default="", help="with --model: bench .csv files (comma-separated) whose "
                        "mojo+fabric all_reduce times are shown next to the predictions")
    args = parser.parse_args(argv)
    if args.model:
        print_model([parse_size(text) for text in args.sizes.split(",")], args.measured, args.output)
        return 0

    from torch_mojo import launcher

    mpi_comm = None
    if launcher.started_by_mpi():
        from mpi4py import MPI

        mpi_comm = MPI.COMM_WORLD
    if launcher.adopt_launcher_environment() is None and "RANK" not in os.environ:
        raise SystemExit("torch-mojo bench: launch it with torchrun, mpirun or srun (no RANK/WORLD_SIZE found)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    import torch
    import torch.distributed as dist

    import torch_mojo

    if not dist.is_gloo_available():
        raise SystemExit("torch-mojo bench: this torch was built without gloo (Spack's py-torch+rocm is), which the "
                         "bench compares with and meets its ranks through: run it with a torch that has gloo, or "
                         "`torch-mojo doctor` for the links' latency and bandwidth")
    torch.set_num_threads(1)
    os.environ.setdefault("TORCH_MOJO_BACKEND_TRACE", "0")
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=10))
    gloo = dist.new_group(backend="gloo")

    if args.kernels:
        sizes = [parse_size(text) for text in args.sizes.split(",")]
        rows = kernel_bandwidth(rank, world, gloo, sizes, args.min_seconds)
        if rank == 0:
            print(f"\n# kernels, {world} ranks at once; GB/s = bytes read + written per second")
            print(f"{'size':>10} {'kernel':>12} {'GB/s per rank':>14} {'GB/s all ranks':>15}")
            for row in rows:
                print(f"{human(row['size_bytes']):>10} {row['kernel']:>12} {row['GBps_per_rank']:>14.1f} "
                      f"{row['GBps_all_ranks']:>15.1f}")
            write_csv(rows, args.output + "-kernels.csv")
        dist.destroy_process_group()
        return
    if args.ddp:
        rates = ddp_steps(rank, world, gloo)
        if rank == 0:
            print(f"\n# DDP, MLP 1024-4096-1024, batch 64, {world} ranks: steps/s (median of 5 x 10 steps)")
            for name, rate in rates.items():
                print(f"{name:>10}: {rate:6.2f} steps/s  ({rate / rates['gloo']:.2f}x gloo)")
            write_csv([{"setup": name, "ranks": world, "steps_per_s": round(rate, 2)} for name, rate in rates.items()],
                       args.output + "-ddp.csv")
        dist.destroy_process_group()
        return

    wanted = args.backends.split(",")
    if world % args.ranks_per_node or (world == args.ranks_per_node and {"mojo+fabric", "p2p", "wire"} & set(wanted)):
        raise SystemExit(f"torch-mojo bench: --ranks-per-node {args.ranks_per_node} must divide the {world} ranks "
                         "into at least 2 nodes")
    runners = []
    for name in wanted:
        if name == "mojo":
            runners.append(TorchRunner(world, rank, "mojo", None))
        elif name == "mojo+pool":
            runners.append(TorchRunner(world, rank, "mojo+pool", None, _pool()))
        elif name == "mojo+fabric":
            runners.append(TorchRunner(world, rank, "mojo+fabric", group_across_nodes(rank // args.ranks_per_node)))
        elif name == "p2p":
            runners.append(PointToPointRunner(world, rank, gloo, args.ranks_per_node))
        elif name == "wire":
            runners.append(WireRunner(world, rank, gloo, args.ranks_per_node))
        elif name == "gloo":
            runners.append(TorchRunner(world, rank, "gloo", gloo))
        elif name == "mojoccl":
            runners.append(LibraryRunner(world, rank, gloo))
        elif name == "mojoccl+pool":
            runners.append(LibraryRunner(world, rank, gloo, _pool()))
        elif name == "mpi" and mpi_comm is not None:
            runners.append(MpiRunner(world, rank, mpi_comm))
        elif name != "mpi":
            raise SystemExit(f"torch-mojo bench: unknown backend {name!r}")
    sizes = [parse_size(text) for text in args.sizes.split(",")]
    rows = []
    for collective in args.collectives.split(","):
        results = {}
        for size in sizes:
            count = max(world, size // 4 // world * world)  # whole parts for every rank
            for runner in runners:
                seconds, wrong = measure(runner, collective, count, args.min_seconds, args.max_iterations,
                                         lambda value: over_ranks(value, gloo, world))
                seconds = over_ranks(seconds, gloo, world)
                wrong = over_ranks(wrong, gloo, world)
                algbw = count * 4 / seconds / 1e9
                busbw = algbw * (1.0 if runner.name in ("p2p", "wire") else BUS_FACTOR[collective](world))
                results[(runner.name, size)] = (seconds, busbw, wrong)
                rows.append({"collective": collective, "size_bytes": size, "count": count, "type": "float32",
                             "backend": runner.name, "ranks": world, "time_us": round(seconds * 1e6, 2),
                             "algbw_GBps": round(algbw, 3), "busbw_GBps": round(busbw, 3), "wrong": wrong})
        if rank == 0:
            print_table(collective, sizes, results, [r.name for r in runners], world)
    if rank == 0:
        write_outputs(rows, args.output, world)
        print(f"\n# wrote {args.output}.csv and {args.output}.png")
    dist.destroy_process_group()


def _pool():
    from torch_mojo import memory

    return memory.default_pool()

