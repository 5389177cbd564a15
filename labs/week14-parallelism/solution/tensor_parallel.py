"""Megatron-LM's tensor-parallel MLP: y = gelu(x @ w1.T + b1) @ w2.T + b2 split over the ranks of the default
process group. w1 is split by its output rows (column-parallel: each rank computes a slice of the hidden
units), w2 by its input columns (row-parallel: each rank computes a partial sum of y). Two conjugate functions
join them (Shoeybi et al. 2019, section 3):

    f: identity forward, all-reduce backward   (x is used by every rank, so dx is the sum of their parts)
    g: all-reduce forward, identity backward   (y is the sum of the ranks' partial products)

so a block's forward costs one all-reduce and its backward one.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F


class CopyToParallel(torch.autograd.Function):
    """f: the input goes to every rank as it is; the gradients the ranks compute for it are summed."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """g: the ranks' partial outputs are summed; each rank's part received the whole output's gradient."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def parallel_mlp(x, w1_shard, b1_shard, w2_shard, b2):
    """This rank's part of the MLP block. x (tokens, d) and b2 (d,) are whole on every rank; w1_shard
    (hidden/world, d) and b1_shard are this rank's rows of w1 and b1; w2_shard (d, hidden/world) its columns
    of w2. Returns the whole y (tokens, d), equal on every rank."""
    h = F.gelu(CopyToParallel.apply(x) @ w1_shard.T + b1_shard)   # (tokens, hidden/world): no communication
    y = ReduceFromParallel.apply(h @ w2_shard.T)                  # partial sums of y, added across ranks
    return y + b2                                                 # the bias once, after the sum
