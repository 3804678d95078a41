"""FSDP2 over `mojo`: a small GPT-style model (tiny_gpt.py, no download)
sharded with fully_shard, block by block and then the root.

    torchrun --standalone --nproc-per-node=2 examples/train_fsdp2.py

- MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) on the
  blocks (their outputs return to float32); the root, which owns the
  embedding, stays in float32.
- Explicit prefetching: each block's forward gathers the next block's
  parameters, each block's backward the previous one's.
- --reshard-after-forward false keeps each block's full parameters from
  forward to backward (less communication, more memory).

Options: --backend gloo runs the same job on gloo; --steps, --log-every.
Rank 0 prints the loss averaged over the ranks.
"""

import argparse

from torch_mojo.distributed import use_local_rank_gpu

use_local_rank_gpu()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

import torch_mojo  # noqa: E402
from tiny_gpt import TinyGPT, batch, chance_loss, loss_of  # noqa: E402

torch_mojo.register_mojo_devices()


def build_sharded(mesh, device, reshard_after_forward=True):
    torch.manual_seed(0)  # the same initial model on every rank
    model = TinyGPT().to(device)
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                 output_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mixed, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    blocks = list(model.blocks)
    for earlier, later in zip(blocks, blocks[1:]):
        earlier.set_modules_to_forward_prefetch([later])
        later.set_modules_to_backward_prefetch([earlier])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    return model, optimizer


def train_step(model, optimizer, step, rank, world):
    inputs, targets = batch(step, rank, world)
    loss = loss_of(model, inputs, targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    return mean.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--reshard-after-forward", default="true", choices=["true", "false"])
    args = parser.parse_args()
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    dist.init_process_group(backend=args.backend or dist.get_default_backend_for_device(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    model, optimizer = build_sharded(mesh, device, args.reshard_after_forward == "true")
    if rank == 0:
        print(f"backend {dist.get_backend()}, {world} ranks, chance loss {chance_loss():.3f}")
    for step in range(1, args.steps + 1):
        loss = train_step(model, optimizer, step, rank, world)
        if rank == 0 and (step % args.log_every == 0 or step == 1):
            print(f"step {step:4d}  loss {loss:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
