"""torch.compile over `mojo`, with the default compiler (inductor; C++ on the
CPU).

    torchrun --standalone --nproc-per-node=2 examples/compile.py

- functional collectives: a hand-written row-parallel layer that sums its
  partial products with torch.distributed._functional_collectives.all_reduce,
  which the compiler traces into the graph instead of breaking it there.
- DTensor TP: parallelize_module with ColwiseParallel / RowwiseParallel,
  then torch.compile of the parallel model.

Each compiled model's forward and backward are compared with the same model
run eagerly. The first call compiles (tens of seconds on a small machine);
torch caches the result, so a second run starts much faster.
"""

import time

from torch_mojo.distributed import use_local_rank_gpu

use_local_rank_gpu()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
from torch import nn  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

import torch_mojo  # noqa: E402
from tensor_parallel import MLP  # noqa: E402

torch_mojo.register_mojo_devices()


class RowParallelMLP(nn.Module):
    """Each rank holds a slice of the hidden layer; the output is the sum of
    the ranks' partial products."""

    def __init__(self, group, width=16, hidden=64):
        super().__init__()
        world = dist.get_world_size(group)
        self.group = group
        self.up = nn.Linear(width, hidden // world)
        self.down = nn.Linear(hidden // world, width, bias=False)

    def forward(self, x):
        partial = self.down(torch.relu(self.up(x)))
        return funcol.all_reduce(partial, "sum", self.group)


def forward_backward(model, x):
    output = model(x)
    output.square().sum().backward()
    return output.detach(), [p.grad for p in model.parameters()]


def largest_difference(eager, compiled):
    worst = torch.zeros(())
    for a, b in zip(eager, compiled):
        a = a.full_tensor() if hasattr(a, "full_tensor") else a
        b = b.full_tensor() if hasattr(b, "full_tensor") else b
        worst = torch.maximum(worst, (a - b).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()


def check(name, build, x):
    """Runs the eager and the compiled twin of build() on x."""
    eager_output, eager_grads = forward_backward(build(), x)
    torch._dynamo.reset()
    start = time.perf_counter()
    compiled_output, compiled_grads = forward_backward(torch.compile(build()), x)
    seconds = time.perf_counter() - start
    breaks = sum(counters["graph_break"].values())
    worst = largest_difference([eager_output, *eager_grads], [compiled_output, *compiled_grads])
    if dist.get_rank() == 0:
        print(f"{name:22s} compiled in {seconds:5.1f} s, {breaks} graph breaks, "
              f"largest difference from eager {worst:.1e}", flush=True)
    assert breaks == 0, f"{name}: the compiler broke the graph {breaks} times: {dict(counters['graph_break'])}"
    assert worst < 1e-5, f"{name}: compiled differs from eager by {worst}"


def main():
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)).to(device)

    def row_parallel():
        torch.manual_seed(rank)  # each rank its own slice
        return RowParallelMLP(dist.group.WORLD).to(device)

    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))

    def tensor_parallel():
        torch.manual_seed(0)
        return parallelize_module(MLP().to(device), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

    check("functional collectives", row_parallel, x)
    check("DTensor TP", tensor_parallel, x)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
