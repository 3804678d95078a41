"""Pipeline parallelism over `mojo`: torch.distributed.pipelining, one stage
per rank, with ScheduleGPipe and then Schedule1F1B.

    torchrun --standalone --nproc-per-node=2 examples/pipeline.py   # 2 stages
    torchrun --standalone --nproc-per-node=4 examples/pipeline.py   # 4 stages

A stack of LAYERS layers is cut into as many stages as there are ranks;
activations go forward and gradients backward between neighbouring ranks
with send/recv. Each schedule trains for a few steps, splitting every batch
into micro-batches, and each rank compares its stage's parameters with the
same layers trained on one process without a pipeline.
"""

from torch_mojo.distributed import use_local_rank_gpu

use_local_rank_gpu()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # noqa: E402

import torch_mojo  # noqa: E402

torch_mojo.register_mojo_devices()

LAYERS = 8
WIDTH = 32
BATCH = 16
MICRO_BATCHES = 4
STEPS = 5


def layers(device):
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(LAYERS))).to(device)


def batch(step, device):
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, WIDTH, generator=generator)
    return x.to(device), x.flip(dims=[1]).to(device)


def mse(output, target):
    return nn.functional.mse_loss(output, target)


def train_one_process(device):
    """The reference: all layers, whole batches, no pipeline."""
    model = layers(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(step, device)
        optimizer.zero_grad()
        mse(model(x), y).backward()
        optimizer.step()
    return model


def train_pipelined(schedule_class, device):
    """Returns this rank's stage (its layers) and the last step's loss, which
    only the last stage knows (None elsewhere)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    per_stage = LAYERS // world
    mine = layers(device)[rank * per_stage:(rank + 1) * per_stage]
    stage = PipelineStage(mine, rank, world, device)
    # scale_grads (the default) divides the summed micro-batch gradients by
    # their number: the gradient of the whole batch's mean loss.
    schedule = schedule_class(stage, n_microbatches=MICRO_BATCHES, loss_fn=mse)
    optimizer = torch.optim.SGD(mine.parameters(), lr=0.1)
    loss = None
    for step in range(STEPS):
        x, y = batch(step, device)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            losses = []
            schedule.step(target=y, losses=losses)
            loss = torch.stack(losses).mean().item()
        else:
            schedule.step()
        optimizer.step()
    return mine, loss


def largest_difference(stage, reference):
    rank, world = dist.get_rank(), dist.get_world_size()
    per_stage = LAYERS // world
    theirs = reference[rank * per_stage:(rank + 1) * per_stage]
    worst = max((a - b).abs().max() for a, b in zip(stage.parameters(), theirs.parameters())).reshape(1)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def main():
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    if LAYERS % world:
        raise SystemExit(f"pipeline.py cuts {LAYERS} layers into one stage per rank: run it on 1, 2, 4 or 8 ranks")
    reference = train_one_process(device)
    for schedule_class in (ScheduleGPipe, Schedule1F1B):
        stage, loss = train_pipelined(schedule_class, device)
        worst = largest_difference(stage, reference)
        if rank == world - 1:
            print(f"{schedule_class.__name__:12s} {world} stages, {MICRO_BATCHES} micro-batches: "
                  f"loss {loss:.4f}, largest difference from one process {worst:.1e}", flush=True)
        assert worst < 1e-5, f"{schedule_class.__name__} drifted from the single-process result by {worst}"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
