"""The Hugging Face Trainer on `mojo`: a small GPT-2 made from its config
(nothing downloaded) trained on runs of counting tokens, with a checkpoint half way
that a second Trainer resumes from.

    torchrun --nproc-per-node=2 examples/clients/trainer_train.py
    torchrun --nproc-per-node=2 examples/clients/trainer_train.py --backend gloo

The Trainer sets its process group up through accelerate, which on CPU
takes gloo whatever it is given: TrainingArguments(ddp_backend="mojo")
raises "Your assigned backend mojo is not available". It keeps a group
that exists, so the group is made first. On GPUs ddp_backend="mojo" works
as it is. docs/integrations.md has the details.
Rank 0 prints the loss the Trainer logged every 5 steps, then the resumed
run's.
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist

import torch_mojo

torch_mojo.register_mojo_devices()

from transformers import (GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainingArguments,  # noqa: E402
                          set_seed)


class CountingTokens(torch.utils.data.Dataset):
    """Runs of consecutive tokens from random starts: learnable."""

    def __init__(self, samples=256, length=32, vocabulary=128):
        generator = torch.Generator().manual_seed(0)
        starts = torch.randint(0, vocabulary, (samples, 1), generator=generator)
        self.tokens = (starts + torch.arange(length)) % vocabulary

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def train(directory, steps, resume=None):
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    arguments = TrainingArguments(output_dir=directory, max_steps=steps, per_device_train_batch_size=4,
                                  learning_rate=3e-3, logging_steps=5, save_steps=steps // 2,
                                  save_strategy="steps", report_to=[], seed=1234, use_cpu=True,
                                  disable_tqdm=True, dataloader_num_workers=0,
                                  ddp_find_unused_parameters=False)
    set_seed(1234)  # the model's initial weights too
    trainer = Trainer(model=GPT2LMHeadModel(config), args=arguments, train_dataset=CountingTokens())
    trainer.remove_callback(PrinterCallback)  # rank 0 prints the losses below
    trainer.train(resume_from_checkpoint=resume)
    return [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mojo")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group(args.backend)  # before the Trainer: accelerate keeps this group
    rank = dist.get_rank()
    with tempfile.TemporaryDirectory() as shared:
        # One directory for every rank: rank 0's, through the group.
        names = [shared]
        dist.broadcast_object_list(names, src=0)
        directory = names[0]
        losses = train(directory, args.steps)
        resumed = train(directory, args.steps, resume=os.path.join(directory, f"checkpoint-{args.steps // 2}"))
        if rank == 0:
            print(f"backend {dist.get_backend()}, {dist.get_world_size()} ranks")
            for step, loss in losses:
                print(f"step {step:3d}  loss {loss:.6f}")
            for step, loss in resumed:
                if step > args.steps // 2:  # the earlier entries come from the checkpoint
                    print(f"resumed: step {step:3d}  loss {loss:.6f}")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
