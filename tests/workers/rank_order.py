"""One rank of the reproducible-reductions job (MOJOCCL_DETERMINISTIC):
every rank draws every rank's input from one seed, so that each computes
the rank-order reference ((x0 + x1) + x2) + ... with torch's own CPU ops in
the tensor's dtype, and compares the collectives' results with it bit for bit.

Usage: rank_order.py check [env|switch|torch]   every case; prints
                                                "differ <n> of <m>" lines and
                                                "checked" (how the mode is
                                                turned on: the environment,
                                                torch_mojo.set_deterministic(),
                                                torch.use_deterministic_algorithms)
       rank_order.py ddp                        a few DDP steps; prints the
                                                parameters' checksum
       rank_order.py mismatch                   rank 0 all-reduces where the
                                                others all-gather as many
                                                bytes, small then large;
                                                prints each error
"""

import hashlib
import sys

import torch
import torch.distributed as dist

import torch_mojo

DTYPES = [torch.float32, torch.bfloat16, torch.float64, torch.float16]
COUNTS = [1, 13, 4099, 65541]  # fewer elements than ranks; small; past the leaders' frames (64 KiB)
OPS = [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.PRODUCT, "product")]


def inputs(world, count, dtype, op_name, salt):
    generator = torch.Generator().manual_seed(1000 + salt)
    drawn = [torch.randn(count, generator=generator, dtype=torch.float64) for _ in range(world)]
    if op_name == "product":  # near 1, so that products stay in range
        drawn = [1 + x / 8 for x in drawn]
    return [x.to(dtype) for x in drawn]


def rank_order(parts, op_name):
    result = parts[0].clone()
    for part in parts[1:]:
        result = result * part if op_name == "product" else result + part
    return result / len(parts) if op_name == "avg" else result


def differing(got, want):
    return int((got.view(torch.uint8).view(-1, got.element_size()) !=
                want.view(torch.uint8).view(-1, want.element_size())).any(dim=1).sum())


def check():
    rank, world = dist.get_rank(), dist.get_world_size()
    worst = 0
    salt = 0
    for dtype in DTYPES:
        for count in COUNTS:
            for op, op_name in OPS:
                salt += 1
                parts = inputs(world, count * world, dtype, op_name, salt)
                want = rank_order(parts, op_name)
                cases = []
                got = parts[rank].clone()
                dist.all_reduce(got, op=op)
                cases.append(("all_reduce", got, want))
                got = parts[rank].clone()
                dist.reduce(got, dst=world - 1, op=op)
                if rank == world - 1:
                    cases.append(("reduce", got, want))
                got = torch.empty(count, dtype=dtype)
                dist.reduce_scatter_tensor(got, parts[rank], op=op)
                cases.append(("reduce_scatter", got, want[rank * count:(rank + 1) * count]))
                for name, got, expected in cases:
                    wrong = differing(got, expected)
                    worst = max(worst, wrong)
                    if wrong:
                        print(f"differ {wrong} of {expected.numel()}: {name} {dtype} {op_name} count {count}",
                              flush=True)
    print(f"checked, at most {worst} differing", flush=True)


def ddp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    ddp_model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(7 + dist.get_rank())
    for _ in range(5):
        batch = torch.randn(32, 64, generator=generator)
        loss = ddp_model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"parameters {digest}", flush=True)


def mismatch():
    """The rank-order path builds on an all-gather and on exchanges rank to
    rank: a rank in a real all-gather must not be taken for one of them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for count in (8, 1 << 16):
        try:
            if rank == 0:
                dist.all_reduce(torch.ones(count * world, dtype=torch.bfloat16))
            else:
                dist.all_gather_into_tensor(torch.empty(count * world, dtype=torch.bfloat16),
                                            torch.ones(count, dtype=torch.bfloat16))
            print("no error", flush=True)
        except RuntimeError as error:
            print(f"error: {str(error).splitlines()[0]}", flush=True)


def main():
    mode = sys.argv[1]
    how = sys.argv[2] if len(sys.argv) > 2 else "env"
    if how == "switch":
        torch_mojo.set_deterministic()
    elif how == "torch":
        torch.use_deterministic_algorithms(True)
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo")
    {"check": check, "ddp": ddp, "mismatch": mismatch}[mode]()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
