"""One rank of the conformance-matrix job.

Every torch.distributed call the backend supports, over every dtype, reduce
op, root and layout, on the default (mojo) group. Each result is checked
against values this rank computes on its own from every rank's inputs
(which are deterministic), and, where gloo supports the case, against the
same call on a gloo group over the same ranks and inputs.

Usage: collectives.py [--quick] [--device]
  --quick   all-reduce and reduce-scatter only, fewer sizes
  --device  the tensors on this process's accelerator (the emulated device
            of tests/emulated_device when EMULATED_DEVICE_LIBRARY is set),
            without gloo, the CPU pool, Work timeouts or mismatches (a
            vendor library reports those by ending the run)
With TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 (torch's torchcomms path) there is
no gloo group to compare with: torch makes every subgroup by splitting the
default group's communicator, so a "gloo" subgroup would be mojo again.
Prints "checked N cases (G also on gloo)" and exits 1 listing the failures.
"""

import argparse
import datetime
import gc
import math
import os
import sys
import time
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
# Around the library's limits: empty, tiny, odd, and more than one 1 MiB
# staging slot (several rounds).
SIZES = [0, 1, 5, 1000, 300_003]
# Where the tensors are: the CPU, or the accelerator with --device.
DEVICE = torch.device("cpu")


def ops_for(dtype):
    return [name for name in OPS if not (dtype == torch.bool and name == "avg")]


THROUGH_TORCHCOMMS = os.environ.get("TORCH_DISTRIBUTED_USE_TORCHCOMMS") == "1"


def gloo_supports(dtype, op=None):
    """What gloo does: no uint32/uint64, and AVG only on floating types."""
    if dtype in (torch.uint32, torch.uint64):
        return False
    return not (op == "avg" and not dtype.is_floating_point)


def make_input(rank, numel, dtype, seed, op="sum", nan=True):
    """Rank `rank`'s input: any rank can compute any other rank's."""
    generator = torch.Generator().manual_seed(seed * 131 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=generator, device="cpu").bool().to(DEVICE)
    if dtype.is_floating_point:
        if op == "product":  # stay near 1: no overflow over 4 ranks
            values = 1 + 0.25 * torch.randn(numel, generator=generator, dtype=torch.float64, device="cpu")
        else:
            values = torch.randn(numel, generator=generator, dtype=torch.float64, device="cpu") * 10
        if nan and op in ("min", "max") and numel > 1 and rank == 1:
            values[1] = float("nan")  # NaN must win, as in torch.minimum/maximum
        return values.to(dtype).to(DEVICE)
    low = 0 if dtype in (torch.uint8, torch.uint32, torch.uint64) else -3
    return torch.randint(low, 4, (numel,), generator=generator, dtype=torch.int64, device="cpu").to(dtype).to(DEVICE)


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


def scale_of(results):
    return max([1.0] + [t.abs().max().item() for t in results if t.numel()])


def partial_sums_scale(inputs, op):
    """How large a sum's partial results can grow, which is what its
    roundings scale with: a sum that cancels out is small, its roundings
    on the way are not. None for the other ops (their results' scale)."""
    if op not in ("sum", "avg") or not inputs[0].dtype.is_floating_point:
        return None
    return scale_of([sum(tensor.cpu().double().abs() for tensor in inputs)])


class Matrix:
    def __init__(self, rank, world):
        self.rank = rank
        self.world = world
        self.gloo = None if THROUGH_TORCHCOMMS else dist.new_group(backend="gloo")
        # Ranks on several "nodes" (MOJOCCL_HOSTID): reductions then combine
        # node by node, not in rank order.
        hosts = [None] * world
        dist.all_gather_object(hosts, os.environ.get("MOJOCCL_HOSTID"), group=self.gloo)
        self.spans_nodes = len(set(hosts)) > 1
        self.cases = 0
        self.on_gloo = 0
        self.failures = []
        self.exercised = set()  # the calls the cases ran, named as torch.distributed names them

    def count(self, name):
        """A case ran: its name starts with the call(s) it exercises ("send/recv ...")."""
        self.cases += 1
        self.exercised.update(name.split()[0].split("/"))

    def fail(self, name, message):
        self.failures.append(f"{name}: {message}")

    def case(self, name, run, expected, dtype, op=None, on_gloo=True, scale=None):
        """`run(group)` performs the call on `group` (None: the mojo default
        group) and returns this rank's results (a list of tensors); `expected`
        is the list they must equal; `scale`, where given, what their
        roundings scale with (partial_sums_scale)."""
        self.count(name)
        try:
            ours = run(None)
        except Exception:
            self.fail(name, f"raised\n{traceback.format_exc()}")
            return
        self.same(name, ours, expected, self.placement_tolerance(dtype, expected, scale))
        if on_gloo and self.gloo is not None and gloo_supports(dtype, op) and DEVICE.type == "cpu":
            self.on_gloo += 1
            try:
                theirs = run(self.gloo)
            except Exception:
                self.fail(name + " on gloo", f"raised\n{traceback.format_exc()}")
                return
            self.same(name + " vs gloo", ours, theirs, self.gloo_tolerance(dtype, ours))

    def gloo_tolerance(self, dtype, results):
        """gloo combines in its own order, and rounds half types at every
        step (we round once): floating results agree to a few roundings."""
        if not dtype.is_floating_point:
            return 0
        return self.roundings(dtype, results) if dtype in HALF else 1e-5 * scale_of(results)

    def placement_tolerance(self, dtype, results, scale=None):
        """Within a node, reductions combine in rank order: exact. Across
        nodes each node's ranks combine first, then the nodes: floating
        results may differ from rank order by a few roundings (every rank
        still gets the same bits)."""
        return self.roundings(dtype, results, scale) if self.spans_nodes and dtype.is_floating_point else 0

    def roundings(self, dtype, results, scale=None):
        return self.world * torch.finfo(dtype).eps * (scale or scale_of(results))

    def same(self, name, actual, expected, tolerance=0):
        if len(actual) != len(expected):
            self.fail(name, f"{len(actual)} results, expected {len(expected)}")
            return
        for got, want in zip(actual, expected):
            if got.device != DEVICE:
                self.fail(name, f"a result on {got.device}, not on {DEVICE}")
                return
            try:
                torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=tolerance, equal_nan=True)
            except AssertionError as error:
                self.fail(name, str(error).splitlines()[0])
                return

    def raises(self, name, exception, text, function):
        self.count(name)
        try:
            function()
        except exception as error:
            if text not in str(error):
                self.fail(name, f"message {str(error)!r} lacks {text!r}")
            return
        except Exception as error:
            self.fail(name, f"raised {type(error).__name__}: {error}")
            return
        self.fail(name, f"did not raise {exception.__name__}")

    def check(self, name, condition, detail=""):
        self.count(name)
        if not condition:
            self.fail(name, detail or "condition false")


def layouts(numel):
    """The same values as a contiguous tensor, a transposed view and a view
    at an odd offset (not 16-byte aligned)."""
    yield "contiguous", lambda t: t.clone(), lambda t: t
    if numel >= 6 and numel % 2 == 0:
        yield "transposed", lambda t: t.clone().reshape(2, -1).t(), lambda t: t.t().reshape(-1)
    if numel >= 2:
        yield "offset", lambda t: torch.cat([t[:1], t])[1:], lambda t: t


# ------------------------------------------------------------ reductions

def check_all_reduce(m, sizes):
    seed = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for numel in sizes:
                seed += 1
                inputs = [make_input(r, numel, dtype, seed, op) for r in range(m.world)]
                expected = reference_reduce(inputs, op, m.world)
                chosen = layouts(numel) if numel == 1000 else list(layouts(numel))[:1]
                for layout, make, flatten in chosen:

                    def run(group, make=make, flatten=flatten, inputs=inputs, op=op):
                        tensor = make(inputs[m.rank])
                        dist.all_reduce(tensor, op=OPS[op], group=group)
                        return [flatten(tensor)]

                    has_nan = op in ("min", "max") and dtype.is_floating_point and numel > 1
                    m.case(f"all_reduce {dtype} {op} n={numel} {layout}", run, [expected], dtype, op,
                           on_gloo=not has_nan, scale=partial_sums_scale(inputs, op))


def check_premul_sum(m):
    """PREMUL_SUM (NCCL's): every rank's input times a factor, a number or a
    one-element tensor, summed; the inputs stay as they were."""
    seed = 1500
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for factor in (2.5, torch.tensor([0.5], dtype=dtype)):
            seed += 1
            inputs = [make_input(r, 1000, dtype, seed, nan=False) for r in range(m.world)]
            scaled = [(tensor * factor).to(dtype) for tensor in inputs]
            expected = reference_reduce(scaled, "sum", m.world)
            scale = partial_sums_scale(scaled, "sum")
            kind = "tensor" if isinstance(factor, torch.Tensor) else "number"
            op = dist._make_nccl_premul_sum(factor)

            def all_reduce(group, inputs=inputs, op=op):
                tensor = inputs[m.rank].clone()
                dist.all_reduce(tensor, op=op, group=group)
                return [tensor]

            def reduce(group, inputs=inputs, op=op):
                tensor = inputs[m.rank].clone()
                dist.reduce(tensor, dst=m.world - 1, op=op, group=group)
                return [tensor]

            def reduce_scatter(group, inputs=inputs, op=op):
                source = inputs[m.rank].clone()
                output = torch.empty(1000 // m.world, dtype=dtype) if 1000 % m.world == 0 else None
                if output is None:
                    return []
                dist.reduce_scatter_tensor(output, source, op=op, group=group)
                return [output, source]

            name = f"{dtype} {kind} factor"
            m.case(f"all_reduce premul_sum {name}", all_reduce, [expected], dtype, on_gloo=False, scale=scale)
            mine = expected if m.rank == m.world - 1 else inputs[m.rank]
            m.case(f"reduce premul_sum {name}", reduce, [mine], dtype, on_gloo=False, scale=scale)
            if 1000 % m.world == 0:
                part = expected.chunk(m.world)[m.rank]
                m.case(f"reduce_scatter_tensor premul_sum {name}", reduce_scatter, [part, inputs[m.rank]],
                       dtype, on_gloo=False, scale=scale)
    m.raises("premul_sum on integers", TypeError, "PREMUL_SUM takes floating-point tensors",
             lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)))


def check_reduce(m):
    seed = 1000
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for root in range(m.world):
                for numel in [5, 300_003] if root == m.world - 1 else [5]:
                    seed += 1
                    inputs = [make_input(r, numel, dtype, seed, op, nan=False) for r in range(m.world)]
                    expected = reference_reduce(inputs, op, m.world)

                    def run(group, inputs=inputs, op=op, root=root):
                        tensor = inputs[m.rank].clone()
                        dist.reduce(tensor, dst=root, op=OPS[op], group=group)
                        return [tensor] if m.rank == root else []

                    m.case(f"reduce {dtype} {op} root={root} n={numel}", run,
                           [expected] if m.rank == root else [], dtype, op, scale=partial_sums_scale(inputs, op))


def check_reduce_scatter(m, sizes):
    seed = 30_000
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for numel in sizes:
                seed += 1
                inputs = [make_input(r, m.world * numel, dtype, seed, op, nan=False) for r in range(m.world)]
                expected = reference_reduce(inputs, op, m.world)[m.rank * numel : (m.rank + 1) * numel]

                def listed(group, inputs=inputs, op=op, numel=numel):
                    output = torch.empty(numel, dtype=dtype)
                    pieces = [inputs[m.rank][r * numel : (r + 1) * numel] for r in range(m.world)]
                    dist.reduce_scatter(output, pieces, op=OPS[op], group=group)
                    return [output]

                def single(group, inputs=inputs, op=op, numel=numel):
                    output = torch.empty(numel, dtype=dtype)
                    dist.reduce_scatter_tensor(output, inputs[m.rank], op=OPS[op], group=group)
                    return [output]

                scale = partial_sums_scale(inputs, op)
                m.case(f"reduce_scatter {dtype} {op} n={numel}", listed, [expected], dtype, op, scale=scale)
                m.case(f"reduce_scatter_tensor {dtype} {op} n={numel}", single, [expected], dtype, op, scale=scale)


# ---------------------------------------------------------- data movement

def check_broadcast(m, sizes):
    seed = 10_000
    for dtype in DTYPES:
        for root in range(m.world):
            for numel in sizes:
                seed += 1
                source = make_input(root, numel, dtype, seed)

                def run(group, source=source, root=root, numel=numel):
                    tensor = source.clone() if m.rank == root else torch.zeros(numel, dtype=dtype)
                    dist.broadcast(tensor, src=root, group=group)
                    return [tensor]

                m.case(f"broadcast {dtype} root={root} n={numel}", run, [source], dtype)

        source = make_input(0, 12, dtype, seed).reshape(3, 4)

        def strided(group, source=source):
            tensor = (source.clone() if m.rank == 0 else torch.zeros(3, 4, dtype=dtype)).t()
            dist.broadcast(tensor, src=0, group=group)
            return [tensor]

        m.case(f"broadcast {dtype} transposed view", strided, [source.t()], dtype)


def check_all_gather(m, sizes):
    seed = 20_000
    for dtype in DTYPES:
        for numel in sizes:
            seed += 1
            inputs = [make_input(r, numel, dtype, seed).reshape(numel, 1) for r in range(m.world)]

            def listed(group, inputs=inputs, numel=numel):
                outputs = [torch.empty(numel, 1, dtype=dtype) for _ in range(m.world)]
                dist.all_gather(outputs, inputs[m.rank], group=group)
                return outputs

            def into_tensor(group, inputs=inputs, numel=numel):
                output = torch.empty(m.world * numel, dtype=dtype)
                dist.all_gather_into_tensor(output, inputs[m.rank].reshape(-1), group=group)
                return [output]

            m.case(f"all_gather {dtype} n={numel}", listed, inputs, dtype)
            m.case(f"all_gather_into_tensor {dtype} n={numel}", into_tensor,
                   [torch.cat(inputs).reshape(-1)], dtype)

    # One output list per rank, each with one tensor per input (of any shape).
    shapes = [(1,), (2, 2), (0,), (3, 3, 3)]
    for dtype in (torch.float32, torch.int64, torch.bool):
        seed += 1
        inputs = [[make_input(r, math.prod(shape), dtype, seed + i).reshape(shape)
                   for i, shape in enumerate(shapes)] for r in range(m.world)]

        def coalesced(group, inputs=inputs):
            outputs = [[torch.empty(shape, dtype=dtype) for shape in shapes] for _ in range(m.world)]
            dist.all_gather_coalesced(outputs, inputs[m.rank], group=group)
            return [tensor for per_rank in outputs for tensor in per_rank]

        if not THROUGH_TORCHCOMMS:  # its _BackendWrapper takes one output list
            m.case(f"all_gather_coalesced {dtype}", coalesced, [t for per_rank in inputs for t in per_rank], dtype)


def check_gather_scatter(m):
    seed = 40_000
    for dtype in DTYPES:
        for root in range(m.world):
            for numel in [0, 5, 100_001] if root == 0 else [5]:
                seed += 1
                inputs = [make_input(r, numel, dtype, seed) for r in range(m.world)]

                def gather(group, inputs=inputs, root=root, numel=numel):
                    outputs = [torch.empty(numel, dtype=dtype) for _ in range(m.world)] if m.rank == root else None
                    dist.gather(inputs[m.rank].clone(), outputs, dst=root, group=group)
                    return outputs if m.rank == root else []

                def scatter(group, inputs=inputs, root=root, numel=numel):
                    output = torch.empty(numel, dtype=dtype)
                    dist.scatter(output, [t.clone() for t in inputs] if m.rank == root else None, src=root,
                                 group=group)
                    return [output]

                m.case(f"gather {dtype} root={root} n={numel}", gather, inputs if m.rank == root else [], dtype)
                m.case(f"scatter {dtype} root={root} n={numel}", scatter, [inputs[m.rank]], dtype)


def check_all_to_all(m):
    seed = 50_000
    for dtype in DTYPES:
        for uneven in (False, True):
            seed += 1
            # Rank r sends (r + p + 1) rows of 3 to rank p when uneven, else 2.
            rows_to = [[(r + p + 1) if uneven else 2 for p in range(m.world)] for r in range(m.world)]
            inputs = [make_input(r, 3 * sum(rows_to[r]), dtype, seed).reshape(-1, 3) for r in range(m.world)]

            def part(sender, receiver):
                start = sum(rows_to[sender][:receiver])
                return inputs[sender][start : start + rows_to[sender][receiver]]

            expected = torch.cat([part(r, m.rank) for r in range(m.world)])

            def single(group, uneven=uneven, expected=expected):
                output = torch.empty_like(expected)
                dist.all_to_all_single(
                    output, inputs[m.rank],
                    output_split_sizes=[rows_to[r][m.rank] for r in range(m.world)] if uneven else None,
                    input_split_sizes=rows_to[m.rank] if uneven else None, group=group)
                return [output]

            def listed(group):
                outputs = [torch.empty_like(part(r, m.rank)) for r in range(m.world)]
                dist.all_to_all(outputs, [part(m.rank, p).clone() for p in range(m.world)], group=group)
                return outputs

            kind = "uneven" if uneven else "even"
            m.case(f"all_to_all_single {dtype} {kind}", single, [expected], dtype)
            # gloo's list form takes equal sizes only.
            m.case(f"all_to_all {dtype} {kind}", listed, [part(r, m.rank) for r in range(m.world)], dtype,
                   on_gloo=not uneven)
    check_large_all_to_all(m)


def check_large_all_to_all(m):
    """Parts of every kind in one call: to the next rank 2.4 MiB (between
    nodes: pieces of 1 MiB and a tail), to itself 600 KiB, to the others a
    few bytes (with their headers, in one message)."""
    def rows(sender, receiver):
        if receiver == (sender + 1) % m.world:
            return 209_717
        return 51_203 if receiver == sender else sender + receiver + 1
    uneven_all_to_all(m, "all_to_all_single float32 large uneven", rows, 59_999)
    # One large part among small ones: between nodes the node that sends it
    # goes rank to rank, the others in the leaders' frames, and the node
    # that receives it gets the small parts in a hand-out of their own.
    uneven_all_to_all(m, "all_to_all_single float32 one large part",
                      lambda sender, receiver: 25_600 if (sender, receiver) == (0, m.world - 1)
                      else (sender + receiver) % 3 + 1, 59_998)


def uneven_all_to_all(m, name, rows, seed):
    """An all_to_all_single of float32 rows of 3 in which rank s sends rank r
    rows(s, r) of them."""
    rows_to = [[rows(r, p) for p in range(m.world)] for r in range(m.world)]
    inputs = [make_input(r, 3 * sum(rows_to[r]), torch.float32, seed).reshape(-1, 3) for r in range(m.world)]

    def part(sender, receiver):
        start = sum(rows_to[sender][:receiver])
        return inputs[sender][start : start + rows_to[sender][receiver]]

    expected = torch.cat([part(r, m.rank) for r in range(m.world)])

    def single(group):
        output = torch.empty_like(expected)
        dist.all_to_all_single(output, inputs[m.rank], output_split_sizes=[rows_to[r][m.rank] for r in range(m.world)],
                               input_split_sizes=rows_to[m.rank], group=group)
        return [output]

    m.case(name, single, [expected], torch.float32)


def check_point_to_point(m):
    if m.world < 2:
        return
    right, left = (m.rank + 1) % m.world, (m.rank - 1) % m.world
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.uint64):
        for numel in (0, 7, 600_000):  # inline, and a buffer of its own
            mine = make_input(m.rank, numel, dtype, 60_000 + numel)
            from_left = make_input(left, numel, dtype, 60_000 + numel)

            def blocking(group, mine=mine, numel=numel):
                # Even ranks send first, odd ranks receive first.
                received = torch.empty(numel, dtype=dtype)
                if m.rank % 2 == 0:
                    dist.send(mine, right, group=group)
                    dist.recv(received, left, group=group)
                else:
                    dist.recv(received, left, group=group)
                    dist.send(mine, right, group=group)
                return [received]

            def both_ways(group, mine=mine, numel=numel):
                # Every rank sends before it receives, in both directions at
                # once: buffered sends make this safe at any size.
                got_left, got_right = torch.empty(numel, dtype=dtype), torch.empty(numel, dtype=dtype)
                works = [dist.isend(mine, right, group=group), dist.isend(mine, left, group=group),
                         dist.irecv(got_left, left, group=group), dist.irecv(got_right, right, group=group)]
                for work in works:
                    work.wait()
                return [got_left, got_right]

            def batched(group, mine=mine, numel=numel):
                got_left = torch.empty(numel, dtype=dtype)
                ops = [dist.P2POp(dist.irecv, got_left, left, group=group),
                       dist.P2POp(dist.isend, mine, right, group=group)]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()
                return [got_left]

            def send_first(group, mine=mine, numel=numel):
                # Every rank calls a blocking send before its receive.
                received = torch.empty(numel, dtype=dtype)
                dist.send(mine, right, group=group)
                dist.recv(received, left, group=group)
                return [received]

            from_right = make_input(right, numel, dtype, 60_000 + numel)
            # Not on gloo: there every rank waits in send for a receive that
            # never comes (seen with 1,000 floats).
            m.case(f"send/recv all send first {dtype} n={numel}", send_first, [from_left], dtype,
                   on_gloo=False)
            m.case(f"send/recv ring {dtype} n={numel}", blocking, [from_left], dtype)
            m.case(f"isend/irecv both ways {dtype} n={numel}", both_ways, [from_left, from_right], dtype)
            m.case(f"batch_isend_irecv {dtype} n={numel}", batched, [from_left], dtype)

    # Several messages between the same two ranks arrive in order.
    def in_order(group):
        sends = [dist.isend(torch.full((i + 1,), float(m.rank * 10 + i)), right, group=group) for i in range(5)]
        received = [torch.empty(i + 1) for i in range(5)]
        for i in range(5):
            dist.recv(received[i], left, group=group)
        for work in sends:
            work.wait()
        return received

    m.case("five messages in order", in_order, [torch.full((i + 1,), float(left * 10 + i)) for i in range(5)],
           torch.float32)

    # One batch of several messages each way between the same two ranks,
    # large ones (a header, then the data) among small ones (with theirs).
    sizes = [300_000, 7, 200_000]

    def several_in_a_batch(group):
        received = [torch.empty(n) for n in sizes]
        ops = [dist.P2POp(dist.isend, torch.full((n,), float(m.rank * 10 + i)), right, group=group)
               for i, n in enumerate(sizes)]
        ops += [dist.P2POp(dist.irecv, tensor, left, group=group) for tensor in received]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return received

    m.case("a batch of large and small messages", several_in_a_batch,
           [torch.full((n,), float(left * 10 + i)) for i, n in enumerate(sizes)], torch.float32)

    # A receive without a source rank (MPI_ANY_SOURCE): rank 0 takes one
    # message from each other rank, in whatever order they come.
    def from_any_rank(group):
        if m.rank != 0:
            dist.send(torch.full((3,), float(m.rank)), 0, group=group)
            return []
        received = {}
        for _ in range(m.world - 1):
            tensor = torch.empty(3)
            received[dist.recv(tensor, group=group)] = tensor
        return [received[sender] for sender in sorted(received)]

    # torchcomms has no receive without a source (its _BackendWrapper
    # refuses it), and no device tensor may take one.
    if DEVICE.type != "cpu" or THROUGH_TORCHCOMMS:
        return
    if m.spans_nodes:
        if m.rank == 0:
            m.raises("recv from any rank across nodes", RuntimeError, "nodes: pass the source rank",
                     lambda: dist.recv(torch.empty(3)))
        return
    m.case("recv from any rank", from_any_rank,
           [torch.full((3,), float(r)) for r in range(1, m.world)] if m.rank == 0 else [], torch.float32)


def sparse_input(rank, dtype, dense_dims):
    """A COO tensor of shape (6, 5, 4...) with 0, 2 or 4 entries, some at the
    same index (uncoalesced)."""
    entries = rank % 3 * 2
    generator = torch.Generator().manual_seed(500 + rank)
    indices = torch.stack([torch.randint(0, 6, (entries,), generator=generator),
                           torch.randint(0, 5, (entries,), generator=generator)])
    values = torch.randint(-5, 6, (entries,) + (4,) * dense_dims, generator=generator).to(dtype)
    return torch.sparse_coo_tensor(indices, values, (6, 5) + (4,) * dense_dims)


def check_sparse_all_reduce(m):
    """What DDP does with sparse gradients (nn.Embedding(sparse=True))."""
    for dtype in (torch.float32, torch.float64, torch.int64):
        for dense_dims in (0, 1):
            def run(group, dense_dims=dense_dims):
                tensor = sparse_input(m.rank, dtype, dense_dims)
                dist.all_reduce(tensor, group=group)
                return [tensor.to_dense()]

            expected = sum(sparse_input(r, dtype, dense_dims).to_dense() for r in range(m.world))
            m.case(f"all_reduce sparse {dtype} dense dims {dense_dims}", run, [expected], dtype)


def check_barriers_objects_groups(m):
    dist.barrier()
    m.check("barrier on the world", True)
    gathered = [None] * m.world
    dist.all_gather_object(gathered, {"rank": m.rank, "text": "x" * m.rank})
    m.check("all_gather_object", gathered == [{"rank": r, "text": "x" * r} for r in range(m.world)], str(gathered))
    objects = [f"from {m.world - 1}", m.world - 1] if m.rank == m.world - 1 else [None, None]
    dist.broadcast_object_list(objects, src=m.world - 1)
    m.check("broadcast_object_list", objects == [f"from {m.world - 1}", m.world - 1], str(objects))
    received = [None] * m.world if m.rank == 0 else None
    dist.gather_object({"from": m.rank}, received, dst=0)
    if m.rank == 0:
        m.check("gather_object", received == [{"from": r} for r in range(m.world)], str(received))
    out = [None]
    dist.scatter_object_list(out, [{"to": r} for r in range(m.world)] if m.rank == 0 else None, src=0)
    m.check("scatter_object_list", out == [{"to": m.rank}], str(out))

    # A subgroup of all ranks but the last: its members reduce and meet at a
    # barrier, the last rank takes no part.
    if m.world >= 3:
        members = list(range(m.world - 1))
        group = dist.new_group(members)
        if m.rank in members:
            tensor = torch.full((3,), float(m.rank))
            dist.all_reduce(tensor, group=group)
            m.check("new_group all_reduce", torch.equal(tensor, torch.full((3,), float(sum(members)))))
            dist.barrier(group=group)
            m.check("barrier on a subgroup", True)
            root = members[-1]  # a global rank, as torch.distributed takes it
            tensor = torch.full((2,), float(m.rank))
            dist.broadcast(tensor, src=root, group=group)
            m.check("new_group broadcast from a global rank", torch.equal(tensor, torch.full((2,), float(root))))
        else:
            m.check("new_group: a rank outside the group", dist.get_rank(group) == -1)
    if m.world >= 2:
        group, _ = dist.new_subgroups(group_size=2 if m.world % 2 == 0 else 1)
        tensor = torch.ones(1)
        dist.all_reduce(tensor, group=group)
        m.check("new_subgroups all_reduce", torch.equal(tensor, torch.full((1,), float(dist.get_world_size(group)))))
        dist.barrier(group=group)
    # The backend's own split, as ProcessGroup.split_group drives it. (torch
    # 2.13's dist.split_group itself refuses to run without an accelerator.)
    halves = [list(range(0, m.world, 2)), list(range(1, m.world, 2))]
    mine = halves[m.rank % 2]
    split = dist.group.WORLD.split_group(mine, timeout=datetime.timedelta(seconds=60),
                                         group_name=f"halves_{m.rank % 2}")
    tensor = torch.full((2,), float(m.rank))
    split._get_backend(torch.device("cpu")).allreduce([tensor]).wait()
    m.check("split_group all_reduce", torch.equal(tensor, torch.full((2,), float(sum(mine)))))
    dist.barrier()


def check_coalesced(m):
    """What DDP and FSDP2 issue: coalescing managers and bucketed calls."""
    tensors = [torch.full((n,), float(m.rank + 1)) for n in (3, 1000, 7)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for tensor in tensors:
            dist.all_reduce(tensor)
    manager.wait()
    total = m.world * (m.world + 1) / 2
    m.check("coalescing_manager all_reduce", all(torch.equal(t, torch.full_like(t, total)) for t in tensors))

    inputs = [torch.full((n,), float(m.rank)) for n in (4, 9)]
    outputs = [torch.empty(m.world * n) for n in (4, 9)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for output, tensor in zip(outputs, inputs):
            dist.all_gather_into_tensor(output, tensor)
    manager.wait()
    expected = [torch.arange(m.world, dtype=torch.float32).repeat_interleave(n) for n in (4, 9)]
    m.check("coalescing_manager all_gather_into_tensor", all(map(torch.equal, outputs, expected)))

    sources = [torch.full((m.world * n,), float(m.rank + 1)) for n in (5, 2)]
    results = [torch.empty(n) for n in (5, 2)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for result, source in zip(results, sources):
            dist.reduce_scatter_tensor(result, source)
    manager.wait()
    m.check("coalescing_manager reduce_scatter_tensor",
            all(torch.equal(r, torch.full((n,), total)) for r, n in zip(results, (5, 2))))

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    pieces = [torch.full((2, 2), float(m.rank)), torch.full((3,), 1.0)]
    backend.allreduce_coalesced(pieces).wait()
    m.check("allreduce_coalesced", torch.equal(pieces[0], torch.full((2, 2), float(sum(range(m.world)))))
            and torch.equal(pieces[1], torch.full((3,), float(m.world))))


# ------------------------------------------------------------ Work objects

def check_work(m):
    # Many outstanding collectives complete in issue order with the right
    # values; is_completed() and get_future() report them.
    tensors = [torch.full((size,), float(m.rank + 1)) for size in (1, 10, 1000, 100_000, 300_000, 7)]
    works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]
    total = m.world * (m.world + 1) / 2
    for work, tensor in zip(reversed(works), reversed(tensors)):
        work.wait()
        m.same(f"async all_reduce n={tensor.numel()}", [tensor], [torch.full_like(tensor, total)])
        m.check(f"async is_completed n={tensor.numel()}", work.is_completed())
        m.same(f"async future n={tensor.numel()}", work.get_future().value(), [torch.full_like(tensor, total)])

    # A tensor the caller drops while its collective runs is kept alive.
    work = dist.all_reduce(torch.full((200_000,), float(m.rank + 1)), async_op=True)
    gc.collect()
    work.wait()
    m.same("dropped tensor", work.get_future().value(), [torch.full((200_000,), total)])

    # torchcomms' _BackendWrapper refuses a wait with a timeout, and its
    # future completes whether the call failed or not (docs/integrations.md).
    if m.world >= 2 and not THROUGH_TORCHCOMMS:
        # wait(timeout=...) raises while the collective still runs; it then
        # completes normally.
        tensor = torch.ones(4)
        if m.rank == 1:
            time.sleep(1.0)
            dist.all_reduce(tensor)
        else:
            work = dist.all_reduce(tensor, async_op=True)
            m.raises("wait with a timeout", RuntimeError, "has not completed; it keeps running",
                     lambda: work.wait(timeout=datetime.timedelta(milliseconds=100)))
            work.wait()
            m.same("completes after a wait timeout", [tensor], [torch.full((4,), float(m.world))])
    if m.world >= 2:
        # Errors surface in wait() and in the future.
        work = dist.all_reduce(torch.ones(4 + m.rank), async_op=True)
        m.raises("error in wait()", RuntimeError, "collective mismatch", work.wait)
        if not THROUGH_TORCHCOMMS:
            m.raises("error in the future", RuntimeError, "collective mismatch", work.get_future().wait)


def check_shared_pool(m):
    """Tensors from the registered pool: collectives read peers' tensors in
    place. Also mixed (only some ranks' tensors in the pool), which must fall
    back to staging on every rank alike."""
    import torch_mojo.memory as shared

    seed = 70_000
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for numel in (5_000, 300_003):
            for mix in ("pool", "mixed"):
                seed += 1
                on_pool = mix == "pool" or m.rank % 2 == 0

                def place(tensor, on_pool=on_pool):
                    return shared.copy_of(tensor) if on_pool else tensor.clone()

                inputs = [make_input(r, numel, dtype, seed, nan=False) for r in range(m.world)]
                expected = reference_reduce(inputs, "sum", m.world)

                def all_reduce(group, inputs=inputs, place=place):
                    tensor = place(inputs[m.rank])
                    dist.all_reduce(tensor, group=group)
                    return [tensor]

                def reduce(group, inputs=inputs, place=place):
                    tensor = place(inputs[m.rank])
                    dist.reduce(tensor, dst=m.world - 1, group=group)
                    return [tensor] if m.rank == m.world - 1 else []

                def broadcast(group, inputs=inputs, place=place):
                    tensor = place(inputs[m.rank])
                    dist.broadcast(tensor, src=0, group=group)
                    return [tensor]

                def all_gather(group, inputs=inputs, place=place, numel=numel):
                    output = place(torch.zeros(m.world * numel, dtype=dtype))
                    dist.all_gather_into_tensor(output, place(inputs[m.rank]), group=group)
                    return [output]

                def reduce_scatter(group, inputs=inputs, place=place, numel=numel):
                    whole = place(torch.cat([inputs[m.rank]] * m.world))
                    output = torch.empty(numel, dtype=dtype)
                    dist.reduce_scatter_tensor(output, whole, group=group)
                    return [output]

                name = f"{dtype} n={numel} {mix}"
                m.case(f"all_reduce pool {name}", all_reduce, [expected], dtype, on_gloo=False)
                m.case(f"reduce pool {name}", reduce, [expected] if m.rank == m.world - 1 else [], dtype,
                       on_gloo=False)
                m.case(f"broadcast pool {name}", broadcast, [inputs[0]], dtype, on_gloo=False)
                m.case(f"all_gather pool {name}", all_gather, [torch.cat(inputs)], dtype, on_gloo=False)
                # Every block of rank r's input is inputs[r]: each rank gets the sum.
                m.case(f"reduce_scatter pool {name}", reduce_scatter, [expected], dtype, on_gloo=False)
    tensor = shared.empty(2, 3, dtype=torch.float16)
    m.check("memory.empty shape and dtype", tensor.shape == (2, 3) and tensor.dtype == torch.float16)
    m.check("memory.stats", shared.stats()["allocated_bytes"] > 0 and shared.stats()["arenas"] >= 1)
    before = shared.stats()["allocated_bytes"]
    with shared.cpu_tensors_in_pool():
        inside = torch.empty(1 << 16)
    during = shared.stats()["allocated_bytes"]
    outside = torch.empty(1 << 16)
    m.check("memory.cpu_tensors_in_pool", during >= before + inside.nbytes
            and shared.stats()["allocated_bytes"] == during, f"{before} {during}")
    del inside, outside
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    if not THROUGH_TORCHCOMMS:  # its _BackendWrapper allocates no tensors
        m.check("allocate_tensor (torch's hook)", backend.supports_tensor_alloc(torch.device("cpu")) and
                backend.allocate_tensor(10, dtype=torch.int32, device=torch.device("cpu")).numel() == 10)


def check_bad_input(m):
    m.raises("bool avg", TypeError, "AVG is not supported on bool",
             lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG))
    m.raises("float8 dtype", TypeError, "does not support float8_e4m3fn",
             lambda: dist.broadcast(torch.ones(4).to(torch.float8_e4m3fn), src=0))
    m.raises("band", ValueError, "ReduceOp.band is not supported",
             lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND))
    # torch answers meta tensors itself; hand one to the backend directly.
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    m.raises("device", ValueError, "handles mojo and cpu tensors; got a tensor on meta",
             lambda: backend.allreduce([torch.ones(4, device="meta")]))
    m.raises("all_gather sizes", ValueError, "has 3 elements where 4 are expected",
             lambda: dist.all_gather([torch.empty(3) for _ in range(m.world)], torch.ones(4)))
    m.raises("into_tensor size", ValueError, "world size x input elements",
             lambda: dist.all_gather_into_tensor(torch.empty(m.world * 4 + 1), torch.ones(4)))
    m.raises("all_to_all splits", ValueError, "split_sizes add up to",
             lambda: dist.all_to_all_single(torch.empty(4 * m.world), torch.ones(4 * m.world),
                                            input_split_sizes=[1] * m.world, output_split_sizes=[4] * m.world))
    sparse = sparse_input(m.rank, torch.float32, 0)
    m.raises("all_reduce sparse max", ValueError, "supports ReduceOp.SUM only",
             lambda: dist.all_reduce(sparse, op=dist.ReduceOp.MAX))
    if not THROUGH_TORCHCOMMS:
        m.raises("all_gather_coalesced lists", ValueError, f"needs {m.world} output lists (one per rank)",
                 lambda: dist.all_gather_coalesced([[torch.empty(2)]] * (m.world + 1), [torch.ones(2)]))
    if m.world >= 2:
        # Ranks that disagree all get the same error, and stay usable.
        m.raises("mismatch", RuntimeError, "collective mismatch", lambda: dist.all_reduce(torch.ones(4 + m.rank)))
        # One rank disagrees, and (on nodes of two ranks) not its node's
        # first: the other nodes learn it from that node's report.
        m.raises("one rank disagrees", RuntimeError, "collective mismatch",
                 lambda: dist.all_reduce(torch.ones(5 if m.rank == 1 else 4)))
        # A small all-reduce on one rank, a large one on the others: the
        # ways they go differ (one message with the data, or an agreement
        # first), and still meet.
        m.raises("small against large", RuntimeError, "collective mismatch",
                 lambda: dist.all_reduce(torch.ones(8 if m.rank == 0 else 100_000)))
        # Between nodes a frame past the provider's eager size goes in
        # pieces (at a 16 KiB limit, 12,000 floats: 4 of them, 5,000: 2);
        # ranks whose frames have different numbers of pieces still meet.
        m.raises("small against pieces", RuntimeError, "collective mismatch",
                 lambda: dist.all_reduce(torch.ones(8 if m.rank == 0 else 12_000)))
        m.raises("pieces against pieces", RuntimeError, "collective mismatch",
                 lambda: dist.all_reduce(torch.ones(5_000 if m.rank == 0 else 12_000)))
        pieces = torch.arange(12_000, dtype=torch.float32) + m.rank
        dist.all_reduce(pieces)
        m.same("all_reduce in pieces", [pieces],
               [torch.arange(12_000, dtype=torch.float32) * m.world + m.world * (m.world - 1) // 2])
        # A small reduce-scatter is a small all-reduce underneath: against
        # a large one, and against an all-reduce of its whole buffer.
        m.raises("reduce_scatter small against large", RuntimeError, "collective mismatch",
                 lambda: dist.reduce_scatter_tensor(torch.empty(8 if m.rank == 0 else 100_000),
                                                    torch.ones(m.world * (8 if m.rank == 0 else 100_000))))
        m.raises("reduce_scatter against all_reduce", RuntimeError, "collective mismatch",
                 lambda: dist.reduce_scatter_tensor(torch.empty(8), torch.ones(m.world * 8)) if m.rank == 0
                 else dist.all_reduce(torch.ones(m.world * 8)))
        m.raises("broadcast small against large", RuntimeError, "collective mismatch",
                 lambda: dist.broadcast(torch.ones(8 if m.rank == 0 else 100_000), src=0))
        m.raises("all_gather small against large", RuntimeError, "collective mismatch",
                 lambda: dist.all_gather_into_tensor(torch.empty(m.world * (8 if m.rank == 0 else 100_000)),
                                                     torch.ones(8 if m.rank == 0 else 100_000)))
        # An all-to-all whose parts disagree in size, past what travels with
        # a header (between nodes such a part goes from the sender's buffer
        # as it is): the rank that expected another size raises, naming
        # both sides, and the part is consumed; the others' calls succeed.
        big = 300_000
        expected_rows = [big - 1 if (m.rank == 0 and r == 1) else big for r in range(m.world)]
        disagreeing = lambda: dist.all_to_all_single(torch.empty(sum(expected_rows)), torch.ones(big * m.world),
                                                     output_split_sizes=expected_rows,
                                                     input_split_sizes=[big] * m.world)
        if m.rank == 0:
            m.raises("all_to_all part size mismatch", RuntimeError,
                     "rank 1 sent 300000 x float32", disagreeing)
        else:
            disagreeing()
        # The same small: between nodes the parts then travel in the
        # leaders' frames (or within a node in shared memory), and still
        # only the rank that expected another count raises; the others
        # receive every part.
        sent = torch.arange(8 * m.world, dtype=torch.float32) + 100 * m.rank
        expected_rows = [7 if (m.rank == 0 and r == 1) else 8 for r in range(m.world)]
        received = torch.full((sum(expected_rows),), -1.0)
        disagreeing = lambda: dist.all_to_all_single(received, sent, output_split_sizes=expected_rows,
                                                     input_split_sizes=[8] * m.world)
        if m.rank == 0:
            m.raises("small all_to_all part size mismatch", RuntimeError, "rank 1 sent 8 x float32", disagreeing)
        else:
            disagreeing()
            m.same("small all_to_all beside a mismatch", [received],
                   [torch.cat([torch.arange(8 * m.rank, 8 * m.rank + 8, dtype=torch.float32) + 100 * r
                               for r in range(m.world)])])
        # An all-to-all agrees on the call as every collective does, within
        # a node (one collective of its ranks) and between nodes.
        m.raises("all_to_all against all_reduce", RuntimeError, "collective mismatch",
                 lambda: dist.all_to_all_single(torch.empty(m.world * 8), torch.ones(m.world * 8)) if m.rank == 0
                 else dist.all_reduce(torch.ones(m.world * 8)))
        m.raises("sparse shapes", ValueError, "every rank must pass a tensor of one shape",
                 lambda: dist.all_reduce(torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long),
                                                                 torch.zeros(0), (3 + m.rank, 4))))
        after = torch.ones(2)
        dist.all_reduce(after)
        m.same("all_reduce after a mismatch", [after], [torch.full((2,), float(m.world))])
        # A message of another size than the receiver expects.
        if m.rank == 0:
            dist.send(torch.ones(6), 1)
        elif m.rank == 1:
            m.raises("message size mismatch", RuntimeError, "rank 0 sent 6 x float32", lambda: dist.recv(torch.empty(5), 0))
        dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", action="store_true")
    args = parser.parse_args()
    if args.device and os.environ.get("EMULATED_DEVICE_LIBRARY"):
        from tests.emulated_device import install

        install()
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo", timeout=datetime.timedelta(seconds=60))
    m = Matrix(dist.get_rank(), dist.get_world_size())
    if args.device:
        global DEVICE
        DEVICE = torch.device(torch.accelerator.current_accelerator().type, torch.accelerator.current_device_index())
        torch.set_default_device(DEVICE)  # torch.empty(...) and the like in the cases
    if args.quick:
        check_all_reduce(m, [0, 5, 300_003])
        check_reduce_scatter(m, [0, 3, 100_001])
    else:
        check_all_reduce(m, SIZES)
        check_reduce(m)
        check_premul_sum(m)
        check_reduce_scatter(m, [0, 3, 100_001])
        check_broadcast(m, [0, 7, 300_003])
        check_all_gather(m, [0, 5, 100_001])
        check_gather_scatter(m)
        check_all_to_all(m)
        check_point_to_point(m)
        if not args.device:
            check_sparse_all_reduce(m)
        check_barriers_objects_groups(m)
        if not THROUGH_TORCHCOMMS:  # its _BackendWrapper takes one tensor a call
            check_coalesced(m)
        if not args.device:
            check_shared_pool(m)
            check_work(m)
            check_bad_input(m)
    dist.destroy_process_group()
    print(f"checked {m.cases} cases ({m.on_gloo} also on gloo)")
    print("exercised: " + " ".join(sorted(m.exercised)))
    if m.failures:
        print(f"{len(m.failures)} failures:")
        for failure in m.failures:
            print("  " + failure)
        sys.exit(1)


if __name__ == "__main__":
    main()
