"""Expert parallelism: a top-k mixture-of-experts layer whose experts are spread over the ranks, tokens sent to
them and their outputs brought back with all_to_all (dispatch and combine)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def moe_layer(x, router, experts, top_k, capacity):
    """x (tokens, d): this rank's tokens. router (d, E): the same on every rank. experts: the E / world experts
    this rank holds, experts[i] being global expert rank * E / world + i. A rank sends each expert at most
    `capacity` of its tokens, the first in token order; the rest of that expert's assignments are dropped.
    Returns (this rank's output (tokens, d), how many of its assignments were dropped)."""
    raise NotImplementedError("TODO: route, dispatch with all_to_all, run the local experts, combine")
