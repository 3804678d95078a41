"""One rank of the collective-matrix job: every collective, dtype, reduce op
and layout the backend supports, checked against values each rank computes
on its own from every rank's (deterministic) inputs.

Usage: collectives.py [--quick]   (--quick: a smaller matrix)
Prints "checked N cases" and exits 1 listing the failures, if any.
"""

import argparse
import datetime
import sys
import traceback

import torch
import torch.distributed as dist

import torch_mojo

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.int8,
    torch.uint32,
    torch.uint64,
    torch.bool,
]
HALF = (torch.float16, torch.bfloat16)
OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
}
# Sizes around the library's limits: empty, tiny, odd, and more than one
# 1 MiB staging slot (several rounds).
SIZES = [0, 1, 5, 1000, 300_003]


def ops_for(dtype):
    return [name for name in OPS if not (dtype == torch.bool and name == "avg")]


def make_input(rank, numel, dtype, seed, op="sum"):
    """Rank `rank`'s input: any rank can compute any other rank's."""
    generator = torch.Generator().manual_seed(seed * 131 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=generator).bool()
    if dtype.is_floating_point:
        if op == "product":  # stay near 1: no overflow over 4 ranks
            values = 1 + 0.25 * torch.randn(numel, generator=generator, dtype=torch.float64)
        else:
            values = torch.randn(numel, generator=generator, dtype=torch.float64) * 10
        if op in ("min", "max") and numel > 1 and rank == 1:
            values[1] = float("nan")  # NaN must win, as in torch.minimum/maximum
        return values.to(dtype)
    low = 0 if dtype in (torch.uint8, torch.uint32, torch.uint64) else -3
    return torch.randint(low, 4, (numel,), generator=generator, dtype=torch.int64).to(dtype)


def reference_reduce(tensors, op, world):
    """The expected reduction: combined in rank order in the accumulation
    type (float32 for float16/bfloat16), rounded once, as documented."""
    dtype = tensors[0].dtype
    if dtype == torch.bool:
        stacked = torch.stack(tensors)
        return stacked.any(0) if op in ("sum", "max") else stacked.all(0)
    # Integers in int64, which torch handles for every op (uint32/uint64 have
    # little arithmetic); the test values are small enough not to wrap.
    acc_type = torch.float32 if dtype in HALF else dtype if dtype.is_floating_point else torch.int64
    acc = tensors[0].to(acc_type)
    for tensor in tensors[1:]:
        value = tensor.to(acc_type)
        if op in ("sum", "avg"):
            acc = acc + value
        elif op == "product":
            acc = acc * value
        elif op == "min":
            acc = torch.minimum(acc, value)
        else:
            acc = torch.maximum(acc, value)
    if op == "avg":
        if acc_type.is_floating_point:
            acc = acc / world
        else:
            acc = torch.div(acc, world, rounding_mode="trunc")  # toward zero, as NCCL
    return acc.to(dtype)


class Checker:
    def __init__(self):
        self.cases = 0
        self.failures = []

    def same(self, name, actual, expected):
        self.cases += 1
        try:
            torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
        except AssertionError as error:
            self.failures.append(f"{name}: {str(error).splitlines()[0]}")

    def run(self, name, function):
        try:
            function()
        except Exception:
            self.cases += 1
            self.failures.append(f"{name}: raised\n{traceback.format_exc()}")

    def raises(self, name, exception, text, function):
        self.cases += 1
        try:
            function()
        except exception as error:
            if text not in str(error):
                self.failures.append(f"{name}: message {str(error)!r} lacks {text!r}")
            return
        except Exception as error:
            self.failures.append(f"{name}: raised {type(error).__name__}: {error}")
            return
        self.failures.append(f"{name}: did not raise {exception.__name__}")


def layouts(tensor):
    """The same values as a contiguous tensor, a transposed view and a view
    at an odd offset (not 16-byte aligned)."""
    yield "contiguous", lambda t: t.clone()
    if tensor.numel() >= 6 and tensor.numel() % 2 == 0:
        yield "transposed", lambda t: t.clone().reshape(2, -1).t()
    if tensor.numel() >= 2:
        yield "offset", lambda t: torch.cat([t[:1], t])[1:]


def check_all_reduce(check, rank, world, sizes):
    seed = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for numel in sizes:
                seed += 1
                inputs = [make_input(r, numel, dtype, seed, op) for r in range(world)]
                expected = reference_reduce(inputs, op, world)
                for layout, make in layouts(inputs[rank]) if numel == 1000 else [("contiguous", lambda t: t.clone())]:
                    name = f"all_reduce {dtype} {op} n={numel} {layout}"

                    def case():
                        tensor = make(inputs[rank])
                        dist.all_reduce(tensor, op=OPS[op])
                        check.same(name, tensor.reshape(-1) if layout != "transposed" else tensor.t().reshape(-1), expected)

                    check.run(name, case)


def check_broadcast(check, rank, world, sizes):
    seed = 10_000
    for dtype in DTYPES:
        for root in range(world):
            for numel in sizes:
                seed += 1
                source = make_input(root, numel, dtype, seed)
                name = f"broadcast {dtype} root={root} n={numel}"

                def case():
                    tensor = source.clone() if rank == root else torch.zeros(numel, dtype=dtype)
                    dist.broadcast(tensor, src=root)
                    check.same(name, tensor, source)

                check.run(name, case)
        name = f"broadcast {dtype} transposed view"

        def strided():
            source = make_input(0, 12, dtype, seed).reshape(3, 4)
            tensor = (source.clone() if rank == 0 else torch.zeros(3, 4, dtype=dtype)).t()
            dist.broadcast(tensor, src=0)
            check.same(name, tensor, source.t())

        check.run(name, strided)


def check_all_gather(check, rank, world, sizes):
    seed = 20_000
    for dtype in DTYPES:
        for numel in sizes:
            seed += 1
            inputs = [make_input(r, numel, dtype, seed).reshape(numel, 1) for r in range(world)]
            name = f"all_gather {dtype} n={numel}"

            def listed():
                outputs = [torch.empty(numel, 1, dtype=dtype) for _ in range(world)]
                dist.all_gather(outputs, inputs[rank])
                for r in range(world):
                    check.same(f"{name} from rank {r}", outputs[r], inputs[r])

            check.run(name, listed)

            def into_tensor():
                output = torch.empty(world * numel, dtype=dtype)
                dist.all_gather_into_tensor(output, inputs[rank].reshape(-1))
                check.same(f"all_gather_into_tensor {dtype} n={numel}", output, torch.cat(inputs).reshape(-1))

            check.run(f"all_gather_into_tensor {dtype} n={numel}", into_tensor)


def check_reduce_scatter(check, rank, world, sizes):
    seed = 30_000
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for numel in sizes:
                seed += 1
                inputs = [make_input(r, world * numel, dtype, seed, op) for r in range(world)]
                expected = reference_reduce(inputs, op, world)[rank * numel : (rank + 1) * numel]
                name = f"reduce_scatter {dtype} {op} n={numel}"

                def listed():
                    output = torch.empty(numel, dtype=dtype)
                    dist.reduce_scatter(output, list(inputs[rank].chunk(world)) if numel else [torch.empty(0, dtype=dtype)] * world, op=OPS[op])
                    check.same(name, output, expected)

                check.run(name, listed)

                def single():
                    output = torch.empty(numel, dtype=dtype)
                    dist.reduce_scatter_tensor(output, inputs[rank], op=OPS[op])
                    check.same(f"reduce_scatter_tensor {dtype} {op} n={numel}", output, expected)

                check.run(f"reduce_scatter_tensor {dtype} {op} n={numel}", single)


def check_async(check, rank, world):
    """Many outstanding collectives complete in issue order with the right
    values; is_completed() and get_future() report them."""
    tensors = [torch.full((size,), float(rank + 1)) for size in (1, 10, 1000, 100_000, 300_000, 7)]
    works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]
    total = world * (world + 1) / 2
    for work, tensor in zip(reversed(works), reversed(tensors)):
        work.wait()
        check.same(f"async all_reduce n={tensor.numel()}", tensor, torch.full_like(tensor, total))
        check.same(f"async is_completed n={tensor.numel()}", torch.tensor(work.is_completed()), torch.tensor(True))
        future_value = work.get_future().value()[0]
        check.same(f"async future n={tensor.numel()}", future_value, torch.full_like(tensor, total))


def check_objects_and_groups(check, rank, world):
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "text": "x" * rank})
    check.cases += 1
    if gathered != [{"rank": r, "text": "x" * r} for r in range(world)]:
        check.failures.append(f"all_gather_object: {gathered}")
    objects = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(objects, src=0)
    check.cases += 1
    if objects != ["from 0", 0]:
        check.failures.append(f"broadcast_object_list: {objects}")
    dist.barrier()
    if world >= 3:
        members = list(range(world - 1))
        group = dist.new_group(members)
        if rank in members:
            tensor = torch.full((3,), float(rank))
            dist.all_reduce(tensor, group=group)
            check.same("all_reduce in a subgroup", tensor, torch.full((3,), float(sum(members))))
            dist.barrier(group=group)
        dist.barrier()


def check_bad_input(check, rank, world):
    tensor = torch.ones(4)
    check.raises("premul_sum", ValueError, "PREMUL_SUM is not supported",
                 lambda: dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(2.0)))
    check.raises("bool avg", TypeError, "AVG is not supported on bool",
                 lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG))
    check.raises("float8 dtype", TypeError, "does not support float8_e4m3fn",
                 lambda: dist.broadcast(torch.ones(4).to(torch.float8_e4m3fn), src=0))
    check.raises("band", ValueError, "ReduceOp.band is not supported",
                 lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND))
    # torch answers meta tensors itself; hand one to the backend directly.
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    check.raises("device", ValueError, "handles mojo and cpu tensors",
                 lambda: backend.allreduce([torch.ones(4, device="meta")]))
    check.raises("all_gather sizes", ValueError, "as many elements as the input",
                 lambda: dist.all_gather([torch.empty(3) for _ in range(world)], torch.ones(4)))
    check.raises("into_tensor size", ValueError, "world size x input elements",
                 lambda: dist.all_gather_into_tensor(torch.empty(world * 4 + 1), torch.ones(4)))
    if world >= 2:
        # Ranks that disagree all get the same error, and stay usable.
        check.raises("mismatch", RuntimeError, "collective mismatch",
                     lambda: dist.all_reduce(torch.ones(4 + rank)))
        after = torch.ones(2)
        dist.all_reduce(after)
        check.same("all_reduce after a mismatch", after, torch.full((2,), float(world)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    check = Checker()
    sizes = [0, 5, 300_003] if args.quick else SIZES
    check_all_reduce(check, rank, world, sizes)
    check_broadcast(check, rank, world, [0, 7, 300_003] if not args.quick else [7])
    check_all_gather(check, rank, world, [0, 5, 100_001] if not args.quick else [5])
    check_reduce_scatter(check, rank, world, [0, 3, 100_001] if not args.quick else [3])
    check_async(check, rank, world)
    check_objects_and_groups(check, rank, world)
    check_bad_input(check, rank, world)
    dist.destroy_process_group()
    print(f"checked {check.cases} cases")
    if check.failures:
        print(f"{len(check.failures)} failures:")
        for failure in check.failures:
            print("  " + failure)
        sys.exit(1)


if __name__ == "__main__":
    main()
