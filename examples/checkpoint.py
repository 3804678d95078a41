"""Distributed checkpoints over `mojo`: torch.distributed.checkpoint saves the
FSDP2-sharded model of train_fsdp2.py with its optimizer, and a fresh job,
at the same or another world size, resumes from it.

    torchrun --standalone --nproc-per-node=2 examples/checkpoint.py --save /tmp/ckpt --at 20 --steps 30
    torchrun --standalone --nproc-per-node=4 examples/checkpoint.py --resume /tmp/ckpt --at 20 --steps 30

Both print the loss of steps 21 to 30: the resumed job continues the first
one. (Every step uses the same global batch whatever the world size; see
tiny_gpt.batch.)

With --every N it checkpoints every N steps into DIR/step-<n> and starts
from the newest one there, so that torchrun can restart a failed job:

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 examples/checkpoint.py \
        --every 5 --dir /tmp/ckpts --steps 30 --kill-rank 1 --kill-at-step 17

kills worker 1 in step 17 of the first attempt; torchrun stops the other,
starts both again, and they go on from step 15.
"""

import argparse
import os
import signal
from pathlib import Path

from torch_mojo.distributed import use_local_rank_gpu

use_local_rank_gpu()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import torch_mojo  # noqa: E402
from train_fsdp2 import build_sharded, train_step  # noqa: E402

torch_mojo.register_mojo_devices()


def save(model, optimizer, checkpoint_id):
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=checkpoint_id)


def load(model, optimizer, checkpoint_id):
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=checkpoint_id)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def train_with_restarts(args, model, optimizer, rank, world):
    """Checkpoints every --every steps; starts after the newest checkpoint."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    saved = sorted(Path(args.dir).glob("step-*"), key=lambda path: int(path.name.split("-")[1]))
    first = 1
    if saved:
        load(model, optimizer, str(saved[-1]))
        first = int(saved[-1].name.split("-")[1]) + 1
    if rank == 0:
        print(f"attempt {attempt}: starting at step {first} on {world} ranks", flush=True)
    for step in range(first, args.steps + 1):
        if attempt == 0 and rank == args.kill_rank and step == args.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = train_step(model, optimizer, step, rank, world)
        if rank == 0:
            print(f"step {step:4d}  loss {loss:.6f}", flush=True)
        if step % args.every == 0:
            save(model, optimizer, f"{args.dir}/step-{step}")


def main():
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--save", help="train to --at, save here, go on to --steps")
    where.add_argument("--resume", help="load what --save wrote, go on to --steps")
    where.add_argument("--every", type=int, help="checkpoint every N steps into --dir; start from the newest")
    parser.add_argument("--at", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dir", default="checkpoints")
    parser.add_argument("--kill-rank", type=int, default=-1, help="with --every: this rank dies...")
    parser.add_argument("--kill-at-step", type=int, default=0, help="...in this step of the first attempt")
    args = parser.parse_args()
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = build_sharded(init_device_mesh(device.type, (world,)), device)

    if args.every:
        train_with_restarts(args, model, optimizer, rank, world)
        dist.destroy_process_group()
        return
    if args.save:
        for step in range(1, args.at + 1):
            train_step(model, optimizer, step, rank, world)
        save(model, optimizer, args.save)
        if rank == 0:
            print(f"saved step {args.at} to {args.save} from {world} ranks")
    else:
        load(model, optimizer, args.resume)
        if rank == 0:
            print(f"resumed step {args.at} from {args.resume} on {world} ranks")

    for step in range(args.at + 1, args.steps + 1):
        loss = train_step(model, optimizer, step, rank, world)
        if rank == 0:
            print(f"step {step:4d}  loss {loss:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
