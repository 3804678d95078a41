"""One rank of a job that survives its faults, with
TORCH_MOJO_BACKEND_PG_WATCHDOG=raise. Usage: survive.py SCENARIO

  killed  4 ranks (one node, or two simulated ones) all-reduce in a loop;
          rank 3 is SIGKILLed by a thread of its own while it is inside one.
          The survivors catch the error, read who failed
          (torch_mojo.distributed.failed_ranks), shrink the default group
          with SHRINK_ABORT and check the new group; then the rank that was
          global rank 2 is killed the same way and the last two shrink again.
  stalled 2 ranks: rank 1 sleeps past the timeout; rank 0's all-reduce
          raises and rank 0 goes on; rank 1's next calls find rank 0 gone.
  disagree 4 ranks: rank 3 leaves; the others shrink with different lists
          (with a short MOJOCCL_BOOTSTRAP_TIMEOUT_S): each must fail.

Each rank prints what it saw; the test reads stdout and exit codes.
"""

import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import torch_mojo
from torch.distributed.distributed_c10d import SHRINK_ABORT

from torch_mojo.distributed import failed_ranks

SCRATCH = os.environ["TEST_SCRATCH"]


def say(text):
    print(text, flush=True)


def die_soon(delay):
    """SIGKILLs this process from another thread, so that the main thread is
    inside a collective when it dies; the moment goes to a file."""

    def kill():
        time.sleep(delay)
        with open(os.path.join(SCRATCH, "killed_at"), "w") as file:
            file.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()


def killed_at():
    with open(os.path.join(SCRATCH, "killed_at")) as file:
        return float(file.read())


def all_reduce_until_failure(victim, global_rank):
    """All-reduces until a collective fails; returns when it did."""
    tensor = torch.ones(1 << 20)
    if global_rank == victim:
        die_soon(0.3)
    while True:
        try:
            dist.all_reduce(tensor)
        except dist.DistBackendError as error:
            failed_at = time.time()
            say(f"error: {str(error).splitlines()[0]}")
            return failed_at
        tensor.fill_(1)


def shrink_after(victim, global_rank):
    failed_at = all_reduce_until_failure(victim, global_rank)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    say(f"get_error: {backend.get_error()}")
    failed = failed_ranks()
    say(f"failed ranks: {failed}")
    dist.shrink_group(failed, shrink_flags=SHRINK_ABORT)
    ready_at = time.time()
    total = torch.full((1000,), float(global_rank))
    dist.all_reduce(total)
    say(f"shrunk: rank {dist.get_rank()} of {dist.get_world_size()}, sum of global ranks "
        f"{total[0].item():g}, error {failed_at - killed_at():.2f} s and new group "
        f"{ready_at - killed_at():.2f} s after the kill")


def stalled():
    dist.init_process_group("mojo", timeout=datetime.timedelta(seconds=2))
    tensor = torch.ones(16)
    dist.all_reduce(tensor)
    if dist.get_rank() == 1:
        time.sleep(6)
    try:
        # Rank 1 may still complete the first (rank 0's part was there before
        # it gave up); it cannot complete a second.
        for _ in range(2):
            dist.all_reduce(tensor)
            say(f"completed: {tensor[0].item():g}")
    except dist.DistBackendError as error:
        say(f"error: {str(error).splitlines()[0]}")
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    say(f"get_error: {backend.get_error()}")
    say(f"failed ranks: {failed_ranks(wait=0.2)}")
    say("went on")


def disagree():
    dist.init_process_group("mojo")
    rank = dist.get_rank()
    if rank == 3:
        time.sleep(5)  # out of the group, alive: keeps the store's host company
        return
    excluded = {0: [3], 1: [0, 3], 2: [1, 3]}[rank]
    started = time.monotonic()
    try:
        dist.shrink_group(excluded, shrink_flags=SHRINK_ABORT)
        say("shrunk")
    except dist.DistBackendError as error:
        say(f"{time.monotonic() - started:.1f} s: {str(error).splitlines()[0]}")


def main():
    torch_mojo.register_mojo_devices()
    if sys.argv[1] in ("stalled", "disagree"):
        return {"stalled": stalled, "disagree": disagree}[sys.argv[1]]()
    dist.init_process_group("mojo", timeout=datetime.timedelta(seconds=30))
    global_rank = dist.get_rank()
    subgroup = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(4), group=subgroup)

    shrink_after(3, global_rank)
    gone = subgroup not in dist.distributed_c10d._world.pg_map
    say(f"subgroup of the old group destroyed: {gone}")
    pair = dist.new_group([0, 1])  # a subgroup of the shrunk group works
    ones = torch.ones(8)
    dist.all_reduce(ones, group=pair)
    say(f"new subgroup: {ones[0].item():g}")
    dist.barrier()

    if dist.get_rank() == 0:
        os.remove(os.path.join(SCRATCH, "killed_at"))
    dist.barrier()
    shrink_after(2, global_rank)
    dist.destroy_process_group()
    say("finished")


if __name__ == "__main__":
    main()
