"""Week 11: ring collectives from point-to-point messages only (torch.distributed send/recv).

Every function runs in every rank of an initialised process group (gloo on CPU, NCCL on GPUs) and works on a
1-D tensor. Use only dist.send / dist.recv (or dist.isend / dist.irecv): no dist.all_reduce, reduce_scatter,
all_gather or broadcast here. The grader counts the calls.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def chunk_sizes(n: int, world: int) -> list[int]:
    """Split n elements into `world` contiguous blocks (your choice of sizes; they must add up to n, and some
    are 0 when n < world)."""
    raise NotImplementedError("TODO: the block sizes, adding up to n")


def ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the ranks; return THIS rank's block of the sum. The blocks of ranks 0, 1, ..., N-1,
    concatenated in rank order, must be the whole sum. N-1 steps around the ring."""
    raise NotImplementedError("TODO: reduce-scatter in N-1 ring steps")


def ring_all_gather(chunk: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Every rank's chunk, concatenated in rank order; sizes[r] is rank r's chunk length (some may be 0).
    N-1 steps around the ring."""
    raise NotImplementedError("TODO: all-gather in N-1 ring steps")


def ring_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over the ranks, on every rank: call ring_reduce_scatter, then ring_all_gather of the
    reduced block (by those names). Return the result (writing it into x as well is fine)."""
    raise NotImplementedError("TODO: reduce-scatter, then all-gather")


def broadcast(x: torch.Tensor, src: int) -> torch.Tensor:
    """src's x on every rank (return it; writing it into x as well is fine)."""
    raise NotImplementedError("TODO: broadcast from src with sends and receives")
