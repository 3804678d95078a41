"""A GPT training script written the device-agnostic way (docs/porting.md):
the small model of tiny_gpt.py under DDP over `mojo`, with bfloat16
autocast, per-rank seeds, fused AdamW, gradient clipping and evaluation.

    torchrun --standalone --nproc-per-node=2 examples/gpt_ddp.py

Options: --backend gloo runs the same job on gloo; --steps, --eval-every,
--seed.
Rank 0 prints the training loss averaged over the ranks, the evaluation
loss on held-out batches, and the throughput.
"""

import argparse
import time

from torch_mojo.distributed import use_local_rank_gpu

use_local_rank_gpu()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import torch_mojo  # noqa: E402
from tiny_gpt import TinyGPT, batch, loss_of  # noqa: E402

torch_mojo.register_mojo_devices()

EVAL_BATCHES = 4


def synchronize():
    """Waits for the device; a CPU-only machine has nothing to wait for (and
    torch.accelerator.synchronize() would raise there)."""
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()


def mean_over_ranks(value, device):
    total = torch.tensor(value, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    return total.item()


@torch.no_grad()
def evaluate(model, device, rank, world):
    """The loss on held-out batches (negative step numbers: never trained on)."""
    model.eval()
    losses = []
    for held_out in range(1, EVAL_BATCHES + 1):
        inputs, targets = batch(-held_out, rank, world)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            losses.append(loss_of(model, inputs.to(device), targets.to(device)).item())
    model.train()
    return mean_over_ranks(sum(losses) / len(losses), device)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    dist.init_process_group(backend=args.backend or dist.get_default_backend_for_device(device))
    rank, world = dist.get_rank(), dist.get_world_size()

    seed = args.seed
    torch.manual_seed(seed + rank)  # DDP copies rank 0's weights to the others
    model = DDP(TinyGPT().to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    if rank == 0:
        print(f"backend {dist.get_backend()}, {world} ranks, device {device}")

    synchronize()
    start, tokens = time.perf_counter(), 0
    for step in range(1, args.steps + 1):
        inputs, targets = batch(step, rank, world)
        inputs, targets = inputs.to(device), targets.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_of(model, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        tokens += inputs.numel() * world

        if step % args.eval_every == 0 or step == args.steps:
            train_loss = mean_over_ranks(loss.item(), device)
            eval_loss = evaluate(model, device, rank, world)
            synchronize()
            rate = tokens / (time.perf_counter() - start)
            if rank == 0:
                print(f"step {step:4d}  train {train_loss:.4f}  eval {eval_loss:.4f}  "
                      f"{rate:,.0f} tokens/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
