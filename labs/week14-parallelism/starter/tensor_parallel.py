"""Megatron-LM's tensor-parallel MLP: y = gelu(x @ w1.T + b1) @ w2.T + b2 split over the ranks of the default
process group. w1 is split by its output rows (column-parallel), w2 by its input columns (row-parallel). Two
conjugate functions join them (Shoeybi et al. 2019, section 3):

    f: identity forward, all-reduce backward
    g: all-reduce forward, identity backward
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F


class CopyToParallel(torch.autograd.Function):
    """f"""

    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("TODO: f's forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("TODO: f's backward")


class ReduceFromParallel(torch.autograd.Function):
    """g"""

    @staticmethod
    def forward(ctx, partial):
        raise NotImplementedError("TODO: g's forward")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("TODO: g's backward")


def parallel_mlp(x, w1_shard, b1_shard, w2_shard, b2):
    """This rank's part of the MLP block. x (tokens, d) and b2 (d,) are whole on every rank; w1_shard
    (hidden/world, d) and b1_shard are this rank's rows of w1 and b1; w2_shard (d, hidden/world) its columns
    of w2. Returns the whole y (tokens, d), equal on every rank."""
    raise NotImplementedError("TODO: column-parallel layer between f and g, then the row-parallel one")
