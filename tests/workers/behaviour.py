"""One rank of a process-group scenario about timing and failure.

Usage: behaviour.py SCENARIO
  async_overlap  async_op=True returns while the peer has not joined yet
  timeout        a collective a peer never joins ends in an error, not a hang
  barrier_timeout  a barrier a peer never joins raises in its caller after the
                 group's timeout (as gloo's does); the process goes on
  monitored_barrier  all ranks pass one; then rank 1 skips the next, which
                 fails on every other rank naming it
  pending_send   rank 0 sends to rank 1, which receives it only after
                 all-reduces of as many elements: each result is right
                 (a buffered send is never taken for a collective's message)
  send_then_exit rank 0 sends rank 1 a small and a large message and ends;
                 rank 1 receives both once rank 0's process is gone, but not
                 a third one; no shared memory of theirs is left behind
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_mojo


def pending_send(rank):
    for dtype in (torch.float32, torch.bfloat16):
        for count in (4, 1 << 18):
            message = torch.full((count,), 7.0, dtype=dtype)
            sent = dist.isend(message, 1) if rank == 0 else None
            summed = torch.full((count,), float(rank + 1), dtype=dtype)
            dist.all_reduce(summed)
            right = bool((summed == 3).all())
            if rank == 1:
                received = torch.empty(count, dtype=dtype)
                dist.recv(received, 0)
                right = right and bool((received == 7).all())
            else:
                sent.wait()
            print(f"{dtype} {count}: {'right' if right else 'WRONG'}", flush=True)
    dist.destroy_process_group()


def send_then_exit(rank):
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    # Within a node: an entry of the channel, then two buffers of their own,
    # both already read once (the receiver has them mapped), so that the
    # sender's end retires buffers that still hold a message.
    sizes = (4, 1 << 20, 1 << 20)
    if rank == 0:
        for count in sizes[1:]:  # both wait in buffers: the receiver reads after the barrier
            dist.send(torch.full((count,), -1.0), 1)
        dist.barrier()
        dist.barrier()
        for index, count in enumerate(sizes + (1 << 19,)):  # the last one never received
            dist.send(torch.full((count,), float(count + index)), 1)
        dist.destroy_process_group()
        return
    dist.barrier()
    for count in sizes[1:]:
        dist.recv(torch.empty(count), 0)
    dist.barrier()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pids[0]}") and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"sender gone: {not os.path.exists(f'/proc/{pids[0]}')}", flush=True)
    for index, count in enumerate(sizes):
        received = torch.empty(count)
        dist.recv(received, 0)
        print(f"{count}: {'right' if bool((received == count + index).all()) else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    left = [name for name in os.listdir("/dev/shm") if f"-p{pids[0]}-" in name or f"-p{pids[1]}-" in name]
    print(f"left in /dev/shm: {left}", flush=True)


def main():
    scenario = sys.argv[1]
    torch_mojo.register_mojo_devices()
    timeout = datetime.timedelta(seconds=3 if scenario == "timeout" else 60)
    dist.init_process_group("mojo", timeout=timeout)
    rank = dist.get_rank()
    if scenario == "pending_send":
        return pending_send(rank)
    if scenario == "send_then_exit":
        return send_then_exit(rank)
    if scenario == "async_overlap":
        tensor = torch.ones(1 << 20)
        if rank == 1:
            time.sleep(1.0)
            dist.all_reduce(tensor)
        else:
            work = dist.all_reduce(tensor, async_op=True)
            print(f"completed at issue: {work.is_completed()}")
            product = torch.randn(256, 256) @ torch.randn(256, 256)  # compute meanwhile
            work.wait()
            print(f"completed after wait: {work.is_completed()} value {tensor[0].item()}")
            print(f"computed {tuple(product.shape)}")
    elif scenario == "timeout":
        if rank == 1:
            time.sleep(8)  # alive, but never joins the all_reduce
            sys.exit(0)
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(8))
            print("no error")
        except RuntimeError as error:
            print(f"{type(error).__name__}: {error}")
        print(f"after {time.monotonic() - start:.1f} s")
        sys.exit(0)
    elif scenario == "barrier_timeout":
        group = dist.new_group(timeout=datetime.timedelta(seconds=1))
        if rank == 0:
            start = time.monotonic()
            try:
                dist.barrier(group=group)
                print("no error")
            except RuntimeError as error:
                print(f"barrier: {type(error).__name__}: {error}")
            print(f"after {time.monotonic() - start:.1f} s")
            try:
                dist.all_reduce(torch.ones(2), group=group)
            except RuntimeError as error:
                print(f"then: {error}")
        tensor = torch.ones(2)
        dist.all_reduce(tensor)  # the default group is untouched
        print(f"default group: {tensor.tolist()}")
        dist.destroy_process_group(group)
    elif scenario == "monitored_barrier":
        world = dist.group.WORLD
        world.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)
        print("all passed")
        if rank != 1:
            start = time.monotonic()
            try:
                world.monitored_barrier(datetime.timedelta(seconds=2))
                print("no error")
            except RuntimeError as error:
                print(f"{type(error).__name__}: {error}")
            print(f"after {time.monotonic() - start:.1f} s")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
