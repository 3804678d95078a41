"""The small regression accelerate_train.py and lightning_train.py train:
the same data and model for both clients."""

import torch

FEATURES = 16


def dataset(samples=512):
    """Inputs and a linear target of them, the same on every rank."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    targets = inputs @ torch.randn(FEATURES, 1, generator=generator) + 0.1
    return torch.utils.data.TensorDataset(inputs, targets)


def model():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
