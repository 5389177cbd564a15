"""FSDP2: shard a model's parameters, gradients and optimiser states with torch.distributed.fsdp.fully_shard."""
from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import fully_shard


def shard_model(model: nn.Sequential) -> nn.Module:
    """One FSDP unit per Linear layer (its parameters are gathered just before it runs and freed after), then
    the root, which owns whatever is left."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model
