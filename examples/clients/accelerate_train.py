"""Hugging Face accelerate on `mojo`: a small regression trained with
Accelerator, its DataLoader, gradient accumulation and a checkpoint.

    torchrun --nproc-per-node=2 examples/clients/accelerate_train.py
    torchrun --nproc-per-node=2 examples/clients/accelerate_train.py --backend gloo

On CPU, accelerate makes its process group on gloo (or MPI) whatever
backend it is given, and refuses any other: InitProcessGroupKwargs(
backend="mojo") raises "Your assigned backend mojo is not available".
It uses the group it finds instead, so the group is made first, before
Accelerator(). On GPUs, InitProcessGroupKwargs(backend="mojo") works as
it is. docs/integrations.md has the details.
Rank 0 prints the loss every 5 steps.
"""

import argparse
import tempfile

import torch
import torch.distributed as dist

import torch_mojo

torch_mojo.register_mojo_devices()

import regression  # noqa: E402

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mojo")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    dist.init_process_group(args.backend)  # before Accelerator(): it keeps this group
    # cpu=True where there is no GPU: without it accelerate sees no
    # distributed run on CPU, and each rank would train alone.
    accelerator = Accelerator(cpu=not torch.accelerator.is_available(), gradient_accumulation_steps=2)
    set_seed(1234)
    model = regression.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    loader = torch.utils.data.DataLoader(regression.dataset(), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.print(f"backend {dist.get_backend()}, {accelerator.num_processes} ranks, "
                      f"accelerate's distributed type {accelerator.distributed_type.value}")

    step = 0
    while step < args.steps:
        for inputs, targets in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            step += 1
            mean = accelerator.reduce(loss.detach(), reduction="mean")
            if step % 5 == 0:
                accelerator.print(f"step {step:3d}  loss {mean.item():.6f}")
            if step == args.steps:
                break

    with tempfile.TemporaryDirectory() as mine:
        shared = [mine]
        dist.broadcast_object_list(shared, src=0)  # one directory for all: rank 0's
        accelerator.save_state(shared[0])  # the model once, every rank's RNG state
        accelerator.wait_for_everyone()
        accelerator.load_state(shared[0])
        accelerator.wait_for_everyone()
    accelerator.print("checkpoint saved and loaded")
    accelerator.end_training()  # destroys the process group too


if __name__ == "__main__":
    main()
