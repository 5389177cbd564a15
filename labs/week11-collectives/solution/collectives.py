"""Week 11: ring collectives from point-to-point messages only (torch.distributed send/recv).

Every function runs in every rank of an initialised process group (gloo on CPU, NCCL on GPUs) and works on a
1-D tensor. No dist.all_reduce, reduce_scatter, all_gather or broadcast here: the grader counts the calls.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def chunk_sizes(n: int, world: int) -> list[int]:
    """Split n elements into `world` contiguous blocks whose sizes differ by at most one (the first n % world
    blocks one larger), like torch.tensor_split."""
    base, extra = divmod(n, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


def _offsets(sizes: list[int]) -> list[int]:
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    return offsets


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, rank: int) -> None:
    """Send to the right neighbour while receiving from the left one. Even ranks send first, odd ranks receive
    first, so two blocking calls never wait on each other (with an odd world the last rank's pair resolves
    because its right neighbour, rank 0, sends first)."""
    if rank % 2 == 0:
        dist.send(send.contiguous(), right)
        dist.recv(recv, left)
    else:
        dist.recv(recv, left)
        dist.send(send.contiguous(), right)


def ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the ranks; return this rank's block of the sum (block `rank` of chunk_sizes(x.numel(), world)).

    N-1 steps: at step s each rank sends its running sum of block (rank - s - 1) to the right and adds what it
    receives from the left to block (rank - s - 2). After N-1 steps block `rank` holds every rank's share."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = chunk_sizes(x.numel(), world)
    offsets = _offsets(sizes)
    acc = x.detach().clone()
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_block = (rank - step - 1) % world
        recv_block = (rank - step - 2) % world
        incoming = torch.empty(sizes[recv_block], dtype=x.dtype, device=x.device)
        _exchange(acc[offsets[send_block]:offsets[send_block + 1]], incoming, right, left, rank)
        acc[offsets[recv_block]:offsets[recv_block + 1]] += incoming
    return acc[offsets[rank]:offsets[rank + 1]].clone()


def ring_all_gather(chunk: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Every rank's chunk, concatenated in rank order; sizes[r] is rank r's chunk length.

    N-1 steps: at step s each rank forwards block (rank - s) to the right and stores block (rank - s - 1)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    offsets = _offsets(sizes)
    out = torch.empty(offsets[-1], dtype=chunk.dtype, device=chunk.device)
    out[offsets[rank]:offsets[rank + 1]] = chunk
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_block = (rank - step) % world
        recv_block = (rank - step - 1) % world
        _exchange(out[offsets[send_block]:offsets[send_block + 1]],
                  out[offsets[recv_block]:offsets[recv_block + 1]], right, left, rank)
    return out


def ring_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over the ranks, on every rank, written into x and returned: reduce-scatter, then
    all-gather of the reduced blocks. Each rank sends 2(N-1)/N of the tensor."""
    block = ring_reduce_scatter(x)
    total = ring_all_gather(block, chunk_sizes(x.numel(), dist.get_world_size()))
    x.copy_(total)
    return x


def broadcast(x: torch.Tensor, src: int) -> torch.Tensor:
    """src's x on every rank (written into x and returned), passed along the ring src -> src+1 -> ... ."""
    rank, world = dist.get_rank(), dist.get_world_size()
    position = (rank - src) % world  # 0 at the source
    if position > 0:
        dist.recv(x, (rank - 1) % world)
    if position < world - 1:
        dist.send(x, (rank + 1) % world)
    return x
