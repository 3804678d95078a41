"""DTensor over `mojo`: tensor parallelism, then 2-D meshes.

    torchrun --standalone --nproc-per-node=2 examples/tensor_parallel.py   # TP
    torchrun --standalone --nproc-per-node=4 examples/tensor_parallel.py   # TP, TP+FSDP, HSDP

Each layout trains the same MLP for a few steps and compares its parameters
with the same training done on one process, without any parallelism, on the
whole global batch: the layouts must change where the work happens, not the
result.

- tp:       parallelize_module, ColwiseParallel then RowwiseParallel, over
            all ranks.
- tp+fsdp:  a ("dp", "tp") mesh of 2 x 2: TP on mesh["tp"], then fully_shard
            on mesh["dp"].
- hsdp:     fully_shard on a ("replicate", "shard") mesh of 2 x 2:
            sharded within pairs of ranks, replicated across them.
"""

from torch_mojo.distributed import use_local_rank_gpu

use_local_rank_gpu()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

import torch_mojo  # noqa: E402

torch_mojo.register_mojo_devices()

STEPS = 5
GLOBAL_BATCH = 8


class MLP(nn.Module):
    """A transformer's MLP block, residual connection included."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def fresh_model(device):
    torch.manual_seed(0)
    return MLP().to(device)


def global_batch(step, device):
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 16, generator=generator)
    return x.to(device), (x.sum(dim=1, keepdim=True) * torch.ones(1, 16)).to(device)


def train(model, device, data_rank, data_ranks):
    """SGD on this rank's share of each global batch (data_ranks shares)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    share = GLOBAL_BATCH // data_ranks
    for step in range(STEPS):
        x, y = global_batch(step, device)
        x, y = x[data_rank * share:(data_rank + 1) * share], y[data_rank * share:(data_rank + 1) * share]
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss


def compare(name, model, reference, rank):
    worst = 0.0
    for (key, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        full = ours.full_tensor() if isinstance(ours, DTensor) else ours
        worst = max(worst, (full - theirs).abs().max().item())
    if rank == 0:
        print(f"{name}: largest difference from one process {worst:.2e}", flush=True)
    assert worst < 1e-5, f"{name} drifted from the single-process result by {worst}"


def main():
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    reference = fresh_model(device)
    train(reference, device, 0, 1)

    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    model = parallelize_module(fresh_model(device), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    train(model, device, 0, 1)  # every TP rank sees the whole batch
    compare("tp", model, reference, rank)

    if world == 4:
        mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(fresh_model(device), mesh["tp"],
                                   {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        train(model, device, mesh["dp"].get_local_rank(), 2)
        compare("tp+fsdp", model, reference, rank)

        mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("replicate", "shard"))
        model = fresh_model(device)
        fully_shard(model, mesh=mesh)
        train(model, device, rank, world)
        compare("hsdp", model, reference, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
