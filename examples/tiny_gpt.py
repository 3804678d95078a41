"""A small GPT-style language model and a synthetic corpus, for the examples.

No download: the corpus is generated. Each sequence counts up from a random
start, modulo the vocabulary, with a step that depends on the start token;
a model that learns the rule predicts every token but the first, so the loss
falls well below log(vocabulary) within a few hundred steps.
"""

import math

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        length = x.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.attention_norm(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.mlp_norm(x))


class TinyGPT(nn.Module):
    def __init__(self, vocabulary=64, width=64, heads=4, depth=4, length=32):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.randn(length, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens):
        x = self.embedding(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        # Logits of every position, (batch x length, vocabulary): a fresh
        # tensor, not a view (FSDP warns about views it hands back).
        return self.head(self.norm(x).reshape(-1, x.shape[-1]))


def batch(step, rank, world, global_batch=16, length=32, vocabulary=64):
    """This rank's share of the global batch of `step`: the same global batch
    whatever the world size, so runs at different sizes see the same data."""
    generator = torch.Generator().manual_seed(10_000 + step)
    start = torch.randint(0, vocabulary, (global_batch, 1), generator=generator)
    stride = 1 + start % 3
    tokens = (start + stride * torch.arange(length + 1)) % vocabulary
    per_rank = global_batch // world
    mine = tokens[rank * per_rank : (rank + 1) * per_rank]
    return mine[:, :-1], mine[:, 1:]


def loss_of(model, inputs, targets):
    logits = model(inputs)
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def chance_loss(vocabulary=64):
    return math.log(vocabulary)
