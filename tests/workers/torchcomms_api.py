"""One rank of a job on torchcomms.new_comm("mojo") itself: the calls that
torchcomms has and c10d has not (all_gather_v, reduce_scatter_v, split by
rank lists, batches of sends and receives), a few that both have, each
synchronous and asynchronous, and a bad call's error. Every value is
checked against what this rank computes from every rank's inputs.
Prints "torchcomms api: all checked" or exits 1 listing the failures."""

import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_mojo

torch_mojo.register_mojo_devices()
import torchcomms  # noqa: E402  (after torch.distributed, as torch imports it)
from torchcomms import ReduceOp  # noqa: E402

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
failures = []


def check(name, got, expected):
    if not torch.equal(got, expected):
        failures.append(f"{name}: got {got.tolist()}, expected {expected.tolist()}")


def case(name, body):
    for async_op in (False, True):
        try:
            body(async_op)
        except Exception:
            failures.append(f"{name} (async_op={async_op}) raised\n{traceback.format_exc()}")


def finish(work, async_op):
    if async_op:
        work.wait()


def values(rank, count):
    """What rank `rank` contributes: count distinct integers, as floats."""
    return torch.arange(count, dtype=torch.float32) + 100 * rank


def run(comm):
    def all_reduce(async_op):
        tensor = values(RANK, 5)
        finish(comm.all_reduce(tensor, ReduceOp.SUM, async_op=async_op), async_op)
        check("all_reduce", tensor, sum(values(r, 5) for r in range(WORLD)))

    def all_gather_v(async_op):
        # Rank r has r + 1 elements: parts of three sizes.
        outputs = [torch.zeros(r + 1) for r in range(WORLD)]
        finish(comm.all_gather_v(outputs, values(RANK, RANK + 1), async_op), async_op)
        for r in range(WORLD):
            check(f"all_gather_v part {r}", outputs[r], values(r, r + 1))

    def reduce_scatter_v(async_op):
        inputs = [values(RANK, r + 2) for r in range(WORLD)]
        kept = [t.clone() for t in inputs]
        output = torch.zeros(RANK + 2)
        finish(comm.reduce_scatter_v(output, inputs, ReduceOp.MAX, async_op), async_op)
        check("reduce_scatter_v", output, values(WORLD - 1, RANK + 2))
        for r in range(WORLD):
            check(f"reduce_scatter_v leaves input {r}", inputs[r], kept[r])

    def all_to_all_v_single(async_op):
        # Rank r sends (r + d + 1) elements to rank d.
        inputs = torch.cat([values(RANK, RANK + d + 1) + d for d in range(WORLD)])
        output = torch.zeros(sum(s + RANK + 1 for s in range(WORLD)))
        out_sizes = [s + RANK + 1 for s in range(WORLD)]
        in_sizes = [RANK + d + 1 for d in range(WORLD)]
        finish(comm.all_to_all_v_single(output, inputs, out_sizes, in_sizes, async_op), async_op)
        check("all_to_all_v_single", output, torch.cat([values(s, s + RANK + 1) + RANK for s in range(WORLD)]))

    def batch(async_op):
        to, frm = (RANK + 1) % WORLD, (RANK - 1) % WORLD
        received = torch.zeros(4)
        batch = comm.batch_op_create()
        batch.send(values(RANK, 4), to)
        batch.recv(received, frm)
        finish(batch.issue(async_op), async_op)
        check("batch send/recv", received, values(frm, 4))

    def broadcast_and_reduce(async_op):
        tensor = values(RANK, 3)
        finish(comm.broadcast(tensor, WORLD - 1, async_op), async_op)
        check("broadcast", tensor, values(WORLD - 1, 3))
        tensor = values(RANK, 3)
        finish(comm.reduce(tensor, 0, ReduceOp.SUM, async_op), async_op)
        if RANK == 0:
            check("reduce", tensor, sum(values(r, 3) for r in range(WORLD)))

    for name, body in [("all_reduce", all_reduce), ("all_gather_v", all_gather_v),
                       ("reduce_scatter_v", reduce_scatter_v), ("all_to_all_v_single", all_to_all_v_single),
                       ("batch", batch), ("broadcast/reduce", broadcast_and_reduce)]:
        case(name, body)


def check_split(comm):
    # Even and odd ranks apart, each a communicator of its own.
    mine = [r for r in range(WORLD) if r % 2 == RANK % 2]
    sub = comm.split(mine, "parity")
    tensor = torch.full((2,), float(RANK))
    sub.all_reduce(tensor, ReduceOp.SUM, False)
    check("split all_reduce", tensor, torch.full((2,), float(sum(mine))))
    if sub.get_size() != len(mine) or sub.get_rank() != mine.index(RANK):
        failures.append(f"split: rank {sub.get_rank()} of {sub.get_size()}, expected {mine.index(RANK)} of {len(mine)}")
    sub.finalize()
    # A rank outside every new group passes [] and gets none.
    if RANK == 0:
        if comm.split([], "nobody") is not None:
            failures.append("split([]) returned a communicator")


def expect_refusal(what, call, words):
    try:
        call()
    except Exception as error:
        if words not in str(error):
            failures.append(f"{what} raised without saying '{words}': {error}")
    else:
        failures.append(f"{what} did not raise")


def check_bad_input(comm, store):
    expect_refusal("a dtype mismatch",
                   lambda: comm.all_gather_single(torch.zeros(WORLD * 2, dtype=torch.int64), torch.ones(2), False),
                   "dtype")
    expect_refusal("reconfigure without enable_reconfigure",
                   lambda: comm.reconfigure(uuid=1, init_handles=[comm.get_init_handle()]),
                   "made without enable_reconfigure=True")
    # Refused before any peer is waited for: every rank raises at once.
    dynamic = torchcomms.new_comm("mojo", torch.device("cpu"), name="dynamic", store=store, enable_reconfigure=True)
    expect_refusal("a call before the first reconfigure", lambda: dynamic.barrier(False),
                   "call reconfigure() with its members' init handles first")
    expect_refusal("reconfigure without the caller's handle",
                   lambda: dynamic.reconfigure(uuid=1, init_handles=["mojo:elsewhere:1:dynamic:0"]),
                   "this rank's init handle")
    twice = [dynamic.get_init_handle()] * 2
    expect_refusal("reconfigure with a handle twice", lambda: dynamic.reconfigure(uuid=1, init_handles=twice),
                   "a handle is listed twice")
    dynamic.finalize()


def main():
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD, RANK == 0,
                          timeout=timedelta(seconds=60))
    comm = torchcomms.new_comm("mojo", torch.device("cpu"), name="api", store=store)
    if comm.get_backend() != "mojo" or comm.get_rank() != RANK or comm.get_size() != WORLD:
        failures.append(f"new_comm: backend {comm.get_backend()}, rank {comm.get_rank()} of {comm.get_size()}")
    run(comm)
    check_split(comm)
    check_bad_input(comm, store)
    comm.barrier(False)
    comm.finalize()
    if failures:
        print(f"{len(failures)} failures:")
        for failure in failures:
            print("  " + failure)
        sys.exit(1)
    print("torchcomms api: all checked")


if __name__ == "__main__":
    main()
