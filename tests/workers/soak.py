"""One rank of the soak job: many random collectives across subgroups,
synchronous and asynchronous, every result checked.

All ranks draw the same sequence from one seed; each rank skips the
operations of groups it is not in. Usage: soak.py [operations]
"""

import os
import random
import sys

import torch
import torch.distributed as dist

import torch_mojo
from tests.workers.collectives import OPS, make_input, partial_sums_scale, reference_reduce

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8]


def main():
    operations = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [(None, list(range(world)))]
    for members in ([0, 1], [2, 3], [0, 2, 3], [1, 3], [4, 5, 6, 7], [1, 4, 6], [0, 7]):
        members = [m for m in members if m < world]
        if len(members) > 1:
            groups.append((dist.new_group(members), members))
    draw = random.Random(1234)
    pending = []  # asynchronous operations not yet waited for
    failures = []
    done = 0

    # Across nodes (MOJOCCL_HOSTID), float32 reductions combine node by node:
    # a few roundings from rank order (bfloat16 is rounded once, as on one node).
    across_nodes = "MOJOCCL_HOSTID" in os.environ

    def same(got, want, scale):
        if not (across_nodes and got.dtype == torch.float32 and got.numel()):
            return torch.equal(got, want)
        tolerance = world * torch.finfo(got.dtype).eps * (scale or max(1.0, want.abs().max().item()))
        return bool(((got - want).abs() <= tolerance).all())

    def drain():
        nonlocal done
        for work, got, want, scale, what in pending:
            work.wait()
            if not same(got, want, scale):
                failures.append(what)
            done += 1
        pending.clear()

    for index in range(operations):
        group, members = draw.choice(groups)
        kind = draw.choice(["all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "all_to_all"])
        dtype = draw.choice(DTYPES)
        op = draw.choice(["sum", "max", "min"] if dtype in (torch.uint8,) else ["sum", "avg", "max", "min"])
        if dtype.is_floating_point is False and op == "avg":
            op = "sum"
        numel = draw.choice([0, 1, 7, 1000, 50_000]) * len(members)
        asynchronous = draw.random() < 0.5
        root = draw.choice(members)
        if rank not in members:
            continue
        n, me = len(members), members.index(rank)
        inputs = [make_input(r, numel, dtype, index, op, nan=False) for r in members]
        if kind == "all_reduce":
            tensor = inputs[me].clone()
            work = dist.all_reduce(tensor, op=OPS[op], group=group, async_op=True)
            expected = reference_reduce(inputs, op, n)
        elif kind == "reduce":
            tensor = inputs[me].clone()
            work = dist.reduce(tensor, dst=root, op=OPS[op], group=group, async_op=True)
            expected = reference_reduce(inputs, op, n) if rank == root else inputs[me]
        elif kind == "broadcast":
            tensor = inputs[me].clone()
            work = dist.broadcast(tensor, src=root, group=group, async_op=True)
            expected = inputs[members.index(root)]
        elif kind == "all_gather":
            tensor = torch.empty(numel * n, dtype=dtype)
            work = dist.all_gather_into_tensor(tensor, inputs[me], group=group, async_op=True)
            expected = torch.cat(inputs)
        elif kind == "reduce_scatter":
            tensor = torch.empty(numel // n, dtype=dtype)
            work = dist.reduce_scatter_tensor(tensor, inputs[me], op=OPS[op], group=group, async_op=True)
            expected = reference_reduce(inputs, op, n)[me * (numel // n):(me + 1) * (numel // n)]
        else:
            tensor = torch.empty(numel, dtype=dtype)
            work = dist.all_to_all_single(tensor, inputs[me], group=group, async_op=True)
            part = numel // n
            expected = torch.cat([inputs[p][me * part:(me + 1) * part] for p in range(n)])
        name = f"op {index}: {kind} {dtype} {op} n={numel} group={members} root={root}"
        reduced = kind in ("all_reduce", "reduce_scatter") or (kind == "reduce" and rank == root)
        scale = partial_sums_scale(inputs, op) if reduced else None
        pending.append((work, tensor, expected, scale, name))
        if not asynchronous or len(pending) > 8:
            drain()
    drain()
    dist.barrier()
    dist.destroy_process_group()
    print(f"soak: {done} operations checked, {len(failures)} wrong")
    for failure in failures[:20]:
        print("  " + failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
