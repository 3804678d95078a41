"""One rank of a fault-tolerant job on torchcomms' reconfigure, as torchft
drives it: communicators made with enable_reconfigure, whose members are
named by their init handles, exchanged through the job's store.

1. The 4 ranks reconfigure into one group and all-reduce.
2. Rank 3 is SIGKILLed while an all-reduce of 64 MiB is in flight; the
   others' wait() raises, they abort and reconfigure without it (3 ranks),
   and all-reduce again.
3. A fresh process (this script with --join) makes a communicator of its
   own and the 4 reconfigure with it; they all-reduce, and the joiner
   checks its result too.

Run with TORCH_MOJO_BACKEND_PG_WATCHDOG=raise: a failed collective raises
in its caller, which decides what to do. Prints "round N: right" lines.
"""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_mojo

torch_mojo.register_mojo_devices()
import torchcomms  # noqa: E402  (after torch.distributed)

TIMEOUT = timedelta(seconds=60)


def store_of(rank):
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, rank == 0,
                         timeout=TIMEOUT, wait_for_workers=False)


def handles(store, round_name, members):
    return [store.get(f"{round_name}/{member}").decode() for member in members]


def all_reduce_check(comm, label):
    tensor = torch.full((1000,), float(comm.get_rank() + 1))
    comm.all_reduce(tensor, torchcomms.ReduceOp.SUM, False)
    size = comm.get_size()
    right = bool((tensor == size * (size + 1) / 2).all())
    print(f"{label}: rank {comm.get_rank()} of {size}: {'right' if right else 'WRONG ' + str(tensor[0].item())}",
          flush=True)


def new_comm(store):
    return torchcomms.new_comm("mojo", torch.device("cpu"), name="ft", store=store, enable_reconfigure=True,
                               timeout=TIMEOUT)


def join():
    """The fresh process of round 3: a communicator of its own, its handle
    published as member "new"; then the round's reconfigure."""
    store = store_of(rank=1)
    comm = new_comm(store)
    store.set("round3/new", comm.get_init_handle())
    comm.reconfigure(uuid=3, init_handles=handles(store, "round3", [0, 1, 2, "new"]), timeout=TIMEOUT).wait()
    all_reduce_check(comm, "round 3 (joiner)")
    comm.finalize()


def main():
    rank = int(os.environ["RANK"])
    store = store_of(rank)
    comm = new_comm(store)
    handle = comm.get_init_handle()

    store.set(f"round1/{rank}", handle)
    comm.reconfigure(uuid=1, init_handles=handles(store, "round1", range(4)), timeout=TIMEOUT).wait()
    all_reduce_check(comm, "round 1")

    # Rank 3 dies with a large all-reduce in flight.
    big = torch.ones(16 << 20)
    work = comm.all_reduce(big, torchcomms.ReduceOp.SUM, True)
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        work.wait()
        print("round 2: the all-reduce with a dead rank did not fail", flush=True)
    except RuntimeError as error:
        print(f"round 2: failed in {time.monotonic() - started:.1f} s: {str(error).splitlines()[0][:160]}",
              flush=True)
    comm.abort()
    store.set(f"round2/{rank}", handle)
    comm.reconfigure(uuid=2, init_handles=handles(store, "round2", range(3)), timeout=TIMEOUT).wait()
    all_reduce_check(comm, "round 2")

    joiner = None
    if rank == 0:
        joiner = subprocess.Popen([sys.executable, __file__, "--join"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
    store.set(f"round3/{rank}", handle)
    comm.reconfigure(uuid=3, init_handles=handles(store, "round3", [0, 1, 2, "new"]), timeout=TIMEOUT).wait()
    all_reduce_check(comm, "round 3")
    comm.finalize()
    if joiner is not None:
        output, _ = joiner.communicate(timeout=60)
        print("".join(line + "\n" for line in output.splitlines() if line.startswith("round")), end="", flush=True)
        print(f"joiner exit {joiner.returncode}", flush=True)


if __name__ == "__main__":
    join() if "--join" in sys.argv else main()
