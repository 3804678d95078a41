"""What torch-mojo adds to a small call over torch's own path: each
collective of 8 bytes a rank, timed in one job three ways, the ways
alternating round by round:

  dist.*        on the `mojo` process group, as a training script calls it
  fake          the same call on a group of torch's `fake` backend in the same
                processes: torch's own Python, dispatcher and Work, no
                communication (the floor any backend pays)
  libmojoccl    the library alone, through ctypes, on a communicator of its own

dist.* minus fake minus libmojoccl is what the process group adds, less
the 1.2 us or so of Python that each call through ctypes pays and the
process group does not (a lower bound, then). The
flight recorder is torch's (`TORCH_FR_BUFFER_SIZE`, 2000 entries by
default; 0 turns it off): run the job both ways to see its share.

    torchrun --standalone --nproc-per-node=2 benchmarks/call_cost.py [--nodes] [--rounds 5] [--calls 3000]

--nodes makes each rank a node of its own (MOJOCCL_HOSTID, the tcp
provider), so the calls cross the fabric path. Prints, on rank 0, each
way's median per-call time in microseconds: the median over the rounds of
each round's median (and the rounds' spread).
"""

import argparse
import os
import statistics
import time
import warnings


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.nodes:
        os.environ.update(MOJOCCL_HOSTID=f"node{rank}", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MOJOCCL_FABRIC_PROVIDER", "tcp")
    os.environ["TORCH_MOJO_BACKEND_TRACE"] = "0"

    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the `fake` backend)

    import torch_mojo
    from torch_mojo.mojoccl import Library

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's new name
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo")
    fake = dist.new_group(backend="fake")
    library = Library()
    uid = [library.unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, 0)
    comm = library.init(world, uid[0], rank)

    whole, part = torch.ones(2 * world), torch.ones(2)
    received, gathered = torch.empty(2 * world), torch.empty(2 * world)
    calls = {
        "all_reduce": (lambda group: dist.all_reduce(part, group=group),
                       lambda: library.all_reduce(comm, part, part)),
        "all_gather": (lambda group: dist.all_gather_into_tensor(gathered, part, group=group),
                       lambda: library.all_gather(comm, part, gathered)),
        "reduce_scatter": (lambda group: dist.reduce_scatter_tensor(part, whole, group=group),
                           lambda: library.reduce_scatter(comm, whole, part)),
        "broadcast": (lambda group: dist.broadcast(part, 0, group=group),
                      lambda: library.broadcast(comm, part, 0)),
        "all_to_all": (lambda group: dist.all_to_all_single(received, whole, group=group),
                       lambda: library.all_to_all(comm, whole, received, world)),
    }
    ways = {}
    for name, (through_torch, alone) in calls.items():
        ways[name, "dist.*"] = lambda call=through_torch: call(None)
        ways[name, "fake"] = lambda call=through_torch: call(fake)
        ways[name, "libmojoccl"] = alone
    medians = {key: [] for key in ways}
    for _ in range(args.rounds):
        for key, call in ways.items():
            for _ in range(100):  # warm
                call()
            dist.barrier()
            times = []
            for _ in range(args.calls):
                start = time.perf_counter_ns()
                call()
                times.append(time.perf_counter_ns() - start)
            medians[key].append(statistics.median(times) / 1000)
    if rank == 0:
        where = f"{world} nodes of 1 rank" if args.nodes else f"{world} ranks on one node"
        recorder = os.environ.get("TORCH_FR_BUFFER_SIZE", "2000 (default)")
        print(f"# 8 bytes a rank, {where}, TORCH_FR_BUFFER_SIZE={recorder}: per call, median of "
              f"{args.rounds} rounds of {args.calls} calls (us)")
        print(f"{'collective':16s} {'dist.*':>16s} {'fake':>16s} {'libmojoccl':>16s} {'added':>7s}")
        for name in calls:
            cells = [medians[name, way] for way in ("dist.*", "fake", "libmojoccl")]
            added = statistics.median(cells[0]) - statistics.median(cells[1]) - statistics.median(cells[2])
            print(f"{name:16s} " + " ".join(f"{statistics.median(c):6.2f} ({min(c):.1f}-{max(c):.1f})".rjust(16)
                                              for c in cells) + f" {added:7.2f}")
    library.destroy(comm)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
