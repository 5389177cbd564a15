"""Activation checkpointing: keep each block's input, recompute its insides during backward."""
from __future__ import annotations

from torch.utils.checkpoint import checkpoint


def checkpointed_forward(model, x):
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return model.head(x)
