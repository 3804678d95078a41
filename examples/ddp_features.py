"""DistributedDataParallel's options over `mojo`, each checked against gloo.

    torchrun --standalone --nproc-per-node=2 examples/ddp_features.py

Every variant below trains the same small network twice in one job: once
with DDP over the default `mojo` group and once over a gloo group of the
same ranks. Each rank then compares its parameters and buffers with its gloo
twin; rank 0 prints the largest difference over all ranks. Data come from a
DistributedSampler (reshuffled each epoch with set_epoch) in every variant.

- synced buffers:          BatchNorm buffers sent from rank 0 every forward
                           (the default; broadcast_buffers=True before
                           torch 2.13).
- local buffers:           forward_sync_buffers=False (broadcast_buffers=False
                           before torch 2.13): each rank keeps its own
                           BatchNorm statistics after the first forward.
- find_unused_parameters:  a branch used only on even steps.
- static_graph:            a reentrant activation checkpoint, the case that
                           needs static_graph=True.
- no_sync accumulation:    two micro-batches per step, the first under
                           no_sync(), so one all-reduce per step.
- fp16 comm hook:          gradients all-reduced in float16
                           (default_hooks.fp16_compress_hook).
- bf16 comm hook:          gradients all-reduced in bfloat16, with torch's
                           bf16_compress_hook. DDP refuses that hook by name
                           unless torch was built for CUDA with NCCL (or
                           XPU), whatever the backend; called from a hook of
                           another name it runs on any backend that sums
                           bfloat16, as mojo and gloo do.
- join, uneven inputs:     rank r trains on r more batches than rank 0;
                           Join keeps the early finishers in the all-reduces.
- many buckets:            1 KB buckets with gradient_as_bucket_view=True:
                           many all-reduces per backward, gradients in place.

Through torchcomms (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1) there is no gloo
group to compare with: each variant trains once, and `--save DIR` keeps its
state dict for a comparison with a run through c10d.
"""

import argparse
import os

from torch_mojo.distributed import use_local_rank_gpu

use_local_rank_gpu()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.distributed.algorithms.join import Join  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import torch_mojo  # noqa: E402

torch_mojo.register_mojo_devices()

EPOCHS = 2
BATCH = 4


def bf16_compress(process_group, bucket):
    return default_hooks.bf16_compress_hook(process_group, bucket)


# name: (DDP keyword arguments, what the training loop does differently)
VARIANTS = {
    "synced buffers": ({}, {}),
    "local buffers": ({"forward_sync_buffers": False}, {}),
    "find_unused_parameters": ({"find_unused_parameters": True}, {"detour": True}),
    "static_graph": ({"static_graph": True}, {"checkpointed": True}),
    "no_sync accumulation": ({}, {"accumulate": 2}),
    "fp16 comm hook": ({}, {"hook": default_hooks.fp16_compress_hook}),
    "bf16 comm hook": ({}, {"hook": bf16_compress}),
    "join, uneven inputs": ({}, {"uneven": True}),
    "many buckets": ({"bucket_cap_mb": 0.001, "gradient_as_bucket_view": True}, {}),
}
# Half-precision gradients: both backends sum the same rounded values, but
# may round their sums differently (mojo accumulates in float32).
TOLERANCE = {"fp16 comm hook": 1e-3, "bf16 comm hook": 1e-2}


class Net(nn.Module):
    def __init__(self, detour=False, checkpointed=False):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.middle = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.detour = nn.Linear(32, 32) if detour else None
        self.head = nn.Linear(32, 1)
        self.checkpointed = checkpointed

    def forward(self, x, step=0):
        h = self.stem(x)
        h = checkpoint(self.middle, h, use_reentrant=True) if self.checkpointed else self.middle(h)
        if self.detour is not None and step % 2 == 0:
            h = h + self.detour(h)
        return self.head(h)


def dataset():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def batches(sampler, rank, device, accumulate, uneven):
    """(step, micro-batches) for every step of every epoch."""
    loader = DataLoader(dataset(), batch_size=BATCH, sampler=sampler)
    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        epoch_batches = [(x.to(device), y.to(device)) for x, y in loader]
        if uneven:  # rank 0 stops first, the highest rank last
            epoch_batches = epoch_batches[: len(epoch_batches) - 2 * (dist.get_world_size() - 1 - rank)]
        for first in range(0, len(epoch_batches) - accumulate + 1, accumulate):
            step += 1
            yield step, epoch_batches[first:first + accumulate]


def train(group, device, ddp_options, detour=False, checkpointed=False, accumulate=1, hook=None, uneven=False):
    torch.manual_seed(0)
    model = DDP(Net(detour, checkpointed).to(device), process_group=group, **ddp_options)
    if hook is not None:
        model.register_comm_hook(group, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    sampler = DistributedSampler(dataset(), num_replicas=world, rank=rank, shuffle=True, seed=0)

    def micro_step(step, x, y):
        loss = nn.functional.mse_loss(model(x, step), y)
        (loss / accumulate).backward()

    with Join([model], enable=uneven):
        for step, micro_batches in batches(sampler, rank, device, accumulate, uneven):
            optimizer.zero_grad(set_to_none=True)
            with model.no_sync():  # all micro-batches but the last: no all-reduce
                for x, y in micro_batches[:-1]:
                    micro_step(step, x, y)
            micro_step(step, *micro_batches[-1])
            optimizer.step()
    return {name: value.detach().clone() for name, value in model.module.state_dict().items()}


def largest_difference(ours, theirs):
    worst = torch.zeros(())
    for name in ours:
        worst = torch.maximum(worst, (ours[name].double() - theirs[name].double()).abs().max().cpu())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the worst rank's
    return worst.item()


def through_torchcomms():
    """torch's torchcomms path (TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 with
    torchcomms installed) makes every subgroup by splitting the default
    group's communicator: a gloo group beside a mojo one cannot be made."""
    enabled = getattr(dist.distributed_c10d, "_use_torchcomms_enabled", None)
    return enabled is not None and enabled()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", metavar="DIR", help="rank 0 saves each variant's trained state dict here")
    args = parser.parse_args()
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    rank = dist.get_rank()
    gloo = None if through_torchcomms() else dist.new_group(backend="gloo")
    if rank == 0:
        against = "each variant against gloo" if gloo else "through torchcomms, no gloo group to compare with"
        print(f"backend {dist.get_backend()}, {dist.get_world_size()} ranks, {against}")
    for name, (ddp_options, loop_options) in VARIANTS.items():
        ours = train(None, device, ddp_options, **loop_options)
        if args.save and rank == 0:
            os.makedirs(args.save, exist_ok=True)
            torch.save(ours, os.path.join(args.save, name.replace(" ", "_").replace(",", "") + ".pt"))
        if gloo is None:
            if rank == 0:
                print(f"{name:24s} trained", flush=True)
            continue
        theirs = train(gloo, device, ddp_options, **loop_options)
        worst = largest_difference(ours, theirs)
        if rank == 0:
            print(f"{name:24s} largest difference from gloo {worst:.1e}", flush=True)
        assert worst <= TOLERANCE.get(name, 1e-5), f"{name}: {worst} from gloo"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
