"""The user guide's minimal DDP script, running on the `mojo` backend.

On a machine without a GPU it trains on the CPU; with one it would use
torch.accelerator.current_accelerator(). Run it with

    torchrun --standalone --nproc-per-node=2 examples/train_ddp.py

Options (for the tests): --backend gloo runs the same job on gloo,
--steps N changes the length, --save PATH where rank 0 saves the weights
(a PATH containing {rank} makes every rank save its own copy).
"""

import argparse

from torch_mojo.distributed import use_local_rank_gpu

use_local_rank_gpu()  # first: give this process its own GPU

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import torch_mojo  # noqa: E402

torch_mojo.register_mojo_devices()


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None, help="default: the one registered for the device")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save", default="checkpoint.pt")
    return parser.parse_args()


def main():
    args = parse_args()
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    backend = args.backend or dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    if rank == 0:
        print(f"backend {dist.get_backend()}, world size {dist.get_world_size()}, device {device}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 2)
    ).to(device)
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # Each rank draws its own batches.
    generator = torch.Generator().manual_seed(1000 + rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 32, generator=generator)
        y = (x.sum(dim=1) > 0).long()  # a toy two-class problem
        x, y = x.to(device), y.to(device)

        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients during backward
        optimizer.step()

        if step % 20 == 0:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:3d}  loss {mean_loss.item():.4f}")

    if rank == 0 or "{rank}" in args.save:  # CPU copies: loadable without the backend
        state = {k: v.cpu() for k, v in model.module.state_dict().items()}
        torch.save(state, args.save.format(rank=rank))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
