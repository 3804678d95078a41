"""One rank of a fault scenario. Usage: faults.py SCENARIO

Every scenario runs real collectives on 2 ranks with a short timeout and
prints what the rank saw; the test reads stdout, stderr and exit codes.

  skip        rank 1 never issues collective #2 (it idles past the timeout)
  mismatch    ranks disagree on count, dtype, op, then root; each must raise
  killed      rank 1 is SIGKILLed while rank 0 waits in a collective
  killed_sender  rank 1 sends rank 0 a large message, then is SIGKILLed before
              rank 0 takes it: the message's buffer must not outlive the job
  exception   rank 1 raises an exception and exits while rank 0 waits
  late        rank 1 arrives 2 s late, within the timeout: must succeed
  interrupt   the test sends SIGINT to both ranks while rank 0 waits
  set_timeout group.set_timeout(1 s) on a group whose collective rank 1 skips
"""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import torch_mojo


def say(text):
    print(text, flush=True)


def main():
    scenario = sys.argv[1]
    torch_mojo.register_mojo_devices()
    timeout = float(os.environ.get("FAULT_TIMEOUT_S", "4"))
    dist.init_process_group("mojo", timeout=datetime.timedelta(seconds=timeout))
    rank = dist.get_rank()
    tensor = torch.ones(1024)
    dist.all_reduce(tensor)  # collective #1: everyone
    say("ready")

    if scenario == "skip":
        if rank == 1:
            time.sleep(timeout + 20)  # alive, answering the watchdog, but never joining
        else:
            dist.all_reduce(tensor)
    elif scenario == "mismatch":
        cases = [
            ("count", lambda: dist.all_reduce(torch.ones(4 + 4 * rank))),
            ("dtype", lambda: dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank else torch.float64))),
            ("op", lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.SUM if rank else dist.ReduceOp.MAX)),
            ("root", lambda: dist.broadcast(torch.ones(4), src=rank)),
        ]
        for name, call in cases:
            try:
                call()
                say(f"{name}: no error")
            except RuntimeError as error:
                say(f"{name}: {type(error).__name__}: {error}")
        dist.all_reduce(tensor)
        say(f"after the mismatches: {tensor[0].item()}")
    elif scenario == "killed":
        if rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(tensor)
    elif scenario == "killed_sender":
        if rank == 1:
            dist.send(torch.ones(600_000), 0)  # buffered in a segment of its own
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(1)
        dist.all_reduce(tensor)
    elif scenario == "exception":
        if rank == 1:
            time.sleep(0.5)
            raise ValueError("rank 1 gives up")
        dist.all_reduce(tensor)
    elif scenario == "late":
        if rank == 1:
            time.sleep(2)
        dist.all_reduce(tensor)
        say(f"late: completed with {tensor[0].item()}")
    elif scenario == "interrupt":
        if rank == 1:
            time.sleep(60)
        else:
            say("waiting in collective #2")
            dist.all_reduce(tensor)
    elif scenario == "set_timeout":
        group = dist.new_group([0, 1])
        group.set_timeout(datetime.timedelta(seconds=1))
        if rank == 1:
            time.sleep(20)
        else:
            dist.all_reduce(tensor, group=group)
    say("finished")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
