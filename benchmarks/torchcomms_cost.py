"""What torchcomms' front door costs per call against c10d's, in one job:
the same all-reduce of SIZE bytes through each layer, the layers
alternating round by round.

  c10d                 the mojo process group's allreduce(), as torch's
                       dist.all_reduce calls it on the c10d path
  torchcomms wrapper   torchcomms' _BackendWrapper over a `mojo` communicator,
                       as dist.all_reduce calls it with TORCH_DISTRIBUTED_USE_TORCHCOMMS=1
  torchcomms           TorchComm.all_reduce, torchcomms' own Python API

torch's Python layer above both (dist.all_reduce's checks and dispatch) is
the same for both paths and is left out. Run with torchrun:

    torchrun --standalone --nproc-per-node=2 benchmarks/torchcomms_cost.py [--nodes 2] [SIZE...]

--nodes 2 puts each rank on a "node" of its own (MOJOCCL_HOSTID, the
libfabric tcp provider between them). Prints, for each size, each layer's
median per-call time in microseconds (the median over ROUNDS rounds of
each round's median) and, past 1 MiB, its bus bandwidth.
"""

import argparse
import os
import statistics
import time
from datetime import timedelta

ROUNDS = 5


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=1)
    parser.add_argument("sizes", nargs="*", default=["8", "4K", "64M"])
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.nodes == 2:
        os.environ["MOJOCCL_HOSTID"] = f"node{rank}"
    os.environ["TORCH_MOJO_BACKEND_TRACE"] = "0"

    import torch
    import torch.distributed as dist

    import torch_mojo

    torch.set_num_threads(1)
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo", timeout=timedelta(seconds=120))
    import torchcomms
    from torchcomms._comms import _BackendWrapper

    store = dist.PrefixStore("torchcomms_cost/", dist.distributed_c10d._get_default_store())
    comm = torchcomms.new_comm("mojo", torch.device("cpu"), name="cost", store=store,
                               hints={"persistent_store": "true"})
    c10d = dist.group.WORLD._get_backend(torch.device("cpu"))
    wrapper = _BackendWrapper(comm)
    options = dist.AllreduceOptions()
    options.asyncOp = False

    def through(backend):
        return lambda tensor: backend.allreduce([tensor], options).wait()

    layers = {
        "c10d": through(c10d),
        "torchcomms wrapper": through(wrapper),
        "torchcomms": lambda tensor: comm.all_reduce(tensor, torchcomms.ReduceOp.SUM, False),
    }
    if rank == 0:
        where = "2 nodes x 1 rank (tcp)" if args.nodes == 2 else f"1 node x {world} ranks"
        print(f"all_reduce through each door, {where}; median us a call over {ROUNDS} rounds (spread)")
    for text in args.sizes:
        size = parse_size(text)
        tensor = torch.ones(max(1, size // 4))
        calls = 3000 if size <= 64 << 10 else 20
        times = {name: [] for name in layers}
        for _ in range(ROUNDS):
            for name, call in layers.items():
                for _ in range(min(calls, 50)):
                    call(tensor)  # warm
                each = []
                for _ in range(calls):
                    start = time.perf_counter()
                    call(tensor)
                    each.append(time.perf_counter() - start)
                times[name].append(statistics.median(each) * 1e6)
        if rank == 0:
            for name, rounds in times.items():
                median = statistics.median(rounds)
                line = f"{text:>5s} {name:20s} {median:10.1f} us  ({min(rounds):.1f}-{max(rounds):.1f})"
                if size >= 1 << 20:
                    line += f"  busbw {2 * (world - 1) / world * size / median / 1e3:.2f} GB/s"
                print(line, flush=True)
    comm.finalize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
