"""Week 16: a paged KV cache. A block allocator hands out fixed-size blocks of cache slots; a sequence's block
table maps its token p to slot p % block_size of block table[p // block_size]. With prefix caching, a full block
is named by the hash of its tokens chained to the hash of the block before it, and a later sequence with the
same prefix shares those blocks (reference counts) instead of computing them again.

README.md states every rule the grader holds you to (which blocks count as free, what is cached, the eviction
order); read it before you start.
"""
from __future__ import annotations

import torch


class BlockAllocator:
    """Blocks 0 .. num_blocks - 1 of block_size token slots each."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        # TODO: reference counts, free blocks, block tables; with prefix caching, hash -> block and the LRU order

    def allocate(self, seq_id, token_ids: list[int]) -> int:
        """Blocks for a new sequence's prompt. Returns the number of its tokens found in the prefix cache (0
        without prefix caching). Raises MemoryError, changing nothing, when the free blocks do not suffice."""
        raise NotImplementedError("allocate: take ceil(len / block_size) blocks, reusing cached full blocks")

    def append(self, seq_id, token_id: int) -> None:
        """One more token (a decode step): a new block when the last one is full; MemoryError when none is free."""
        raise NotImplementedError("append: add a token, and a block when the last one is full")

    def free(self, seq_id) -> None:
        """Drop a finished (or cancelled) sequence: release its blocks, last to first."""
        raise NotImplementedError("free: release every block the sequence holds")

    def block_table(self, seq_id) -> list[int]:
        raise NotImplementedError("block_table: the sequence's blocks, in token order")

    def state(self) -> dict:
        """{"free": [ids of blocks with reference count 0], "ref_counts": [one int per block],
        "block_tables": {seq_id: [block ids]}} (the grader names sequences by strings): it checks the invariants
        after every operation."""
        raise NotImplementedError("state: report free blocks, reference counts and block tables")


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor) -> torch.Tensor:
    """One decode step of attention over a paged cache.

    q (B, n_head, hd); k_cache, v_cache (num_blocks, block_size, kv_heads, hd); block_tables (B, max_blocks)
    int64, padded past each sequence's blocks; context_lens (B,) tokens cached per sequence. Returns
    (B, n_head, hd): sequence b's query against its first context_lens[b] keys."""
    raise NotImplementedError("paged_attention: gather each sequence's keys and values through its block table")
