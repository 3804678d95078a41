"""One rank of the fault drill, with TORCH_MOJO_BACKEND_PG_WATCHDOG=raise.
Usage: drill.py JOB

Faults: kill (SIGKILL), term (SIGTERM, as at a time limit), exception (a
Python exception nobody catches), stop (SIGSTOP for longer than the group's
timeout: a straggler, continued afterwards). Each cell hits one victim; the
survivors catch the error, shrink the default group without it and check
the new group, so one job runs many cells.

  running  10 ranks: every fault inside a collective, then every fault
           between two collectives (8 cells, victims global ranks 1-8).
  init     6 ranks: every fault at once, each on its own victim (global
           ranks 1-4), while the others create a new group: it fails on
           every survivor with the ranks that never checked in; they then
           shrink the default group without those four.

Global rank 0 hosts the store and survives; it waits for every straggler
to finish before it exits. Each rank prints what it saw; the test reads
stdout, stderr and exit codes.
"""

import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import SHRINK_ABORT

import torch_mojo
from torch_mojo.distributed import failed_ranks

FAULTS = ("kill", "term", "exception", "stop")
GROUP_TIMEOUT_S = 2
BOOTSTRAP_TIMEOUT_S = 4  # for the groups made after the job's first
# The cells of each job: global rank 1 is the first victim, and so on.
RUNNING_CELLS = [(kind, place) for place in ("collective", "between") for kind in FAULTS]
INIT_CELLS = [(kind, "init") for kind in FAULTS]


def say(text):
    print(text, flush=True)


def scratch(name):
    return os.path.join(os.environ["TEST_SCRATCH"], name)


def write(name, text):
    with open(scratch(name) + ".new", "w") as file:
        file.write(text)
    os.replace(scratch(name) + ".new", scratch(name))


def read(name):
    with open(scratch(name)) as file:
        return file.read()


def fault(kind, victim):
    """Hits this process with `kind`; the moment goes to a file first. A
    stopped process comes back when a survivor continues it."""
    write(f"fault_at_{victim}", repr(time.time()))
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # the handler reports, dumps and ends the process
    elif kind == "exception":
        raise ValueError(f"global rank {victim} gives up")
    else:
        write(f"pid_{victim}", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)


def fault_soon(kind, victim):
    """The fault, from a thread, while the main thread is in a collective."""
    threading.Thread(target=lambda: (time.sleep(0.3), fault(kind, victim)), daemon=True).start()


def first_line(error):
    return str(error).splitlines()[0]


def straggler_returns(victim, call):
    """A continued straggler finds its group gone: it says so and ends."""
    try:
        call()
        say("straggler: no error")
    except dist.DistBackendError as error:
        say(f"straggler resumed: {first_line(error)}")
    write(f"straggler_done_{victim}", "")
    os._exit(0)


def victim_in_collective(kind, victim, tensor):
    if kind == "exception":
        dist.all_reduce(tensor, async_op=True)  # in flight when the exception ends the process
        fault(kind, victim)
    fault_soon(kind, victim)
    straggler_returns(victim, lambda: [dist.all_reduce(tensor) for _ in range(1000)])


def victim_between(kind, victim, tensor):
    dist.all_reduce(tensor)
    fault(kind, victim)
    straggler_returns(victim, lambda: dist.all_reduce(tensor))


def survive(kind, place, victim, tensor):
    """Runs until the cell's fault fails a collective, then shrinks."""
    started = time.time()
    try:
        if place == "collective":
            while time.time() - started < 30:
                dist.all_reduce(tensor)
        else:
            dist.all_reduce(tensor)
            while not os.path.exists(scratch(f"fault_at_{victim}")):
                time.sleep(0.01)
            time.sleep(0.2)  # the fault has happened by now
            dist.all_reduce(tensor)
        say(f"cell {kind} {place}: no error")
        return
    except dist.DistBackendError as error:
        failed_at = time.time()
        say(f"cell {kind} {place}: error {failed_at - fault_time(victim):.2f} s after the fault: "
            f"{first_line(error)}")
    # The dead are named; a straggler is not (it is alive): the drill knows it.
    listed = failed_ranks(wait=0.5)
    straggler = dist.get_process_group_ranks(dist.group.WORLD).index(victim)
    dist.shrink_group(listed or [straggler], shrink_flags=SHRINK_ABORT)
    check_new_group(f"cell {kind} {place}: failed ranks {listed}; new group", fault_time(victim))
    if kind == "stop" and dist.get_rank() == 0:
        os.kill(int(read(f"pid_{victim}")), signal.SIGCONT)


def fault_time(victim):
    return float(read(f"fault_at_{victim}"))


def check_new_group(headline, since):
    members = dist.get_process_group_ranks(dist.group.WORLD)
    total = torch.full((1000,), float(members[dist.get_rank()]))
    dist.all_reduce(total)
    say(f"{headline} of {len(members)} ranks {time.time() - since:.2f} s after the fault, "
        f"sum {total[0].item():g} (expected {sum(members)})")


def running(rank):
    tensor = torch.ones(1 << 18)
    for victim, (kind, place) in enumerate(RUNNING_CELLS, start=1):
        if rank == victim:
            (victim_in_collective if place == "collective" else victim_between)(kind, victim, tensor)
        survive(kind, place, victim, tensor)
    return [victim for victim, (kind, _) in enumerate(RUNNING_CELLS, start=1) if kind == "stop"]


def init(rank):
    victims = {victim: kind for victim, (kind, _) in enumerate(INIT_CELLS, start=1)}
    if rank in victims:
        fault(victims[rank], rank)
        straggler_returns(rank, lambda: dist.new_group(list(range(6))))
    while not all(os.path.exists(scratch(f"fault_at_{victim}")) for victim in victims):
        time.sleep(0.01)
    since = time.time()
    try:
        dist.new_group(list(range(6)))
        say("init: no error")
    except dist.DistBackendError as error:
        say(f"init: new_group failed {time.time() - since:.1f} s after the faults: {first_line(error)}")
    dist.shrink_group(list(victims), shrink_flags=SHRINK_ABORT)
    check_new_group("init: new group", since)
    stopped = [victim for victim, kind in victims.items() if kind == "stop"]
    if dist.get_rank() == 0:
        for victim in stopped:
            os.kill(int(read(f"pid_{victim}")), signal.SIGCONT)
    return stopped


def main():
    torch_mojo.register_mojo_devices()
    dist.init_process_group("mojo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))  # everyone is here: later creations may be quick to give up
    os.environ["MOJOCCL_BOOTSTRAP_TIMEOUT_S"] = str(BOOTSTRAP_TIMEOUT_S)
    stragglers = {"running": running, "init": init}[sys.argv[1]](rank)
    if rank == 0:  # the store's host: stays until the stragglers have had their say
        deadline = time.time() + 30
        while time.time() < deadline and not all(
                os.path.exists(scratch(f"straggler_done_{victim}")) for victim in stragglers):
            time.sleep(0.05)
    dist.destroy_process_group()
    say("finished")


if __name__ == "__main__":
    main()
