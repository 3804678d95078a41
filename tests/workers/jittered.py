"""One rank of the jittered job: large all-gathers, reduce-scatters,
all-reduces and broadcasts in turn, each rank first sleeping a random 0-3 ms, so that a
peer's data often lands long before its receive is posted. Every
result is checked. After each call the ranks meet in a barrier of a gloo
group, as jobs that mix process groups do: no later message of the mojo
group can deliver one that its call left behind. Usage: jittered.py [calls]"""

import datetime
import random
import sys
import time

import torch
import torch.distributed as dist

import torch_mojo

BLOCK = (4 << 20) // 4  # float32 elements: 4 MiB blocks, 16 MiB buffers on 4 ranks


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    pause = random.Random(rank)
    mine = torch.full((BLOCK,), float(rank + 1))
    everyone = torch.full((BLOCK * world,), float(rank + 1))
    gathered, scattered = torch.empty(BLOCK * world), torch.empty(BLOCK)
    each_rank = torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(BLOCK)
    total = world * (world + 1) / 2
    wrong = 0
    for call in range(calls):
        time.sleep(pause.random() * 0.003)
        kind = call % 4
        if kind == 0:
            dist.all_gather_into_tensor(gathered, mine)
            ok = torch.equal(gathered, each_rank)
        elif kind == 1:
            dist.reduce_scatter_tensor(scattered, everyone)
            ok = bool((scattered == total).all())
        elif kind == 2:
            summed = mine.clone()
            dist.all_reduce(summed)
            ok = bool((summed == total).all())
        else:
            root = call // 4 % world
            received = each_rank.clone() if rank == root else torch.zeros_like(each_rank)
            dist.broadcast(received, src=root)
            ok = torch.equal(received, each_rank)
        wrong += not ok
        dist.barrier(group=gloo)
    print(f"rank {rank}: {calls} calls, {wrong} wrong", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
