"""Distributed checkpoints over `mojo`: torch.distributed.checkpoint saves the
FSDP2-sharded model of train_fsdp2.py with its optimizer, and a fresh job,
at the same or another world size, resumes from it.

    torchrun --standalone --nproc-per-node=2 examples/checkpoint.py --save /tmp/ckpt --at 20 --steps 30
    torchrun --standalone --nproc-per-node=4 examples/checkpoint.py --resume /tmp/ckpt --at 20 --steps 30

Both print the loss of steps 21 to 30: the resumed job continues the first
one. (Every step uses the same global batch whatever the world size; see
tiny_gpt.batch.)
"""

import argparse

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


def main():
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--save", help="train to --at, save here, go on to --steps")
    where.add_argument("--resume", help="load what --save wrote, go on to --steps")
    parser.add_argument("--at", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = build_sharded(init_device_mesh(device.type, (world,)), device)

    if args.save:
        for step in range(1, args.at + 1):
            train_step(model, optimizer, step, rank, world)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=args.save)
        if rank == 0:
            print(f"saved step {args.at} to {args.save} from {world} ranks")
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=args.resume)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        if rank == 0:
            print(f"resumed step {args.at} from {args.resume} on {world} ranks")

    for step in range(args.at + 1, args.steps + 1):
        loss = train_step(model, optimizer, step, rank, world)
        if rank == 0:
            print(f"step {step:4d}  loss {loss:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
