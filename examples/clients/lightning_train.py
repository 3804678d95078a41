"""PyTorch Lightning on `mojo`: a small regression trained by Lightning's
Trainer with DDPStrategy, on 2 CPU processes that Lightning starts itself.

    python examples/clients/lightning_train.py
    python examples/clients/lightning_train.py --backend gloo

Lightning takes the backend from DDPStrategy(process_group_backend=...), or,
without one, torch's default for the device: after register_mojo_devices()
that is mojo. Lightning's launcher runs this script again for each rank
(rank 0 is this process and hosts the store); under torchrun or srun it
takes the ranks it is given instead.
Rank 0 prints the loss every 5 steps.
"""

import argparse

import torch

import torch_mojo

torch_mojo.register_mojo_devices()

import regression  # noqa: E402

import lightning as L  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = regression.model()

    def training_step(self, batch, _):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
        mean = self.trainer.strategy.reduce(loss.detach(), reduce_op="mean")  # an all-reduce
        step = self.global_step + 1
        if step % 5 == 0 and self.global_rank == 0:
            print(f"step {step:3d}  loss {mean.item():.6f}", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mojo")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    L.seed_everything(1234, verbose=False)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=args.backend),
                        max_steps=args.steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    loader = torch.utils.data.DataLoader(regression.dataset(), batch_size=8, shuffle=True)
    trainer.fit(Regression(), loader)
    if trainer.global_rank == 0:
        print(f"backend {torch.distributed.get_backend()}, {trainer.world_size} ranks: done", flush=True)


if __name__ == "__main__":
    main()
