"""A training-like loop on the `mojo` backend while strangers knock
(test_sealed): all-reduces for SECONDS by rank 0's clock, every result
checked; prints "ok sealed rounds=N wrong=W rejected=R", R from
torch_mojo.distributed.turned_away()."""

import os
import time

import torch
import torch.distributed as dist

import torch_mojo
from torch_mojo.distributed import turned_away

torch_mojo.register_mojo_devices()
dist.init_process_group("mojo")
rank, world = dist.get_rank(), dist.get_world_size()
end = time.monotonic() + float(os.environ.get("SECONDS", "3"))
rounds = wrong = 0
while True:
    go_on = torch.tensor([float(rank == 0 and time.monotonic() < end)])
    dist.all_reduce(go_on)
    if go_on.item() == 0:
        break
    for count in (2, 1000, 20_000):
        values = torch.arange(count, dtype=torch.float32) % 1000
        mine = values * (rank + 1)
        dist.all_reduce(mine)
        wrong += int((mine != values * world * (world + 1) / 2).sum())
    rounds += 1
print(f"ok sealed rounds={rounds} wrong={wrong} rejected={turned_away()}", flush=True)
dist.destroy_process_group()
