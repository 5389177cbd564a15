"""Week 16: a paged KV cache. A block allocator hands out fixed-size blocks of cache slots; a sequence's block
table maps its token p to slot p % block_size of block table[p // block_size]. With prefix caching, a full block
is named by the hash of its tokens chained to the hash of the block before it, and a later sequence with the
same prefix shares those blocks (reference counts) instead of computing them again.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch


class BlockAllocator:
    """Blocks 0 .. num_blocks - 1 of block_size token slots each.

    A free block is either plain (no content worth keeping) or cached: unreferenced, but its full contents are
    still named by their hash, so a later sequence can take it back. New blocks come from the plain ones first;
    only when none is left is a cached one evicted, the least recently released first (LRU)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self.ref_counts = [0] * num_blocks
        self.plain = list(range(num_blocks))         # free, nothing cached: a stack
        self.evictable: OrderedDict[int, None] = OrderedDict()  # free but cached, least recently released first
        self.cached: dict[int, int] = {}             # block hash -> block holding those tokens
        self.block_hash: dict[int, int] = {}         # block -> its hash, while cached
        self.tables: dict[object, list[int]] = {}
        self.tokens: dict[object, list[int]] = {}

    # -- prefix hashes ---------------------------------------------------------------------------------------
    def _chain(self, token_ids: list[int]) -> list[int]:
        """The hash of every full block: each covers the block's tokens AND the hash before it, so equal
        tokens after different prefixes get different hashes."""
        hashes, prev, bs = [], None, self.block_size
        for i in range(len(token_ids) // bs):
            prev = hash((prev, tuple(token_ids[i * bs:(i + 1) * bs])))
            hashes.append(prev)
        return hashes

    def _register(self, block: int, h: int) -> None:
        if self.prefix_caching and h not in self.cached:  # the first block with these contents keeps the name
            self.cached[h] = block
            self.block_hash[block] = h

    # -- blocks ----------------------------------------------------------------------------------------------
    def _num_free(self) -> int:
        return len(self.plain) + len(self.evictable)

    def _new_block(self) -> int:
        if self.plain:
            block = self.plain.pop()
        else:  # evict the least recently released cached block: its contents are overwritten
            block, _ = self.evictable.popitem(last=False)
            del self.cached[self.block_hash.pop(block)]
        self.ref_counts[block] = 1
        return block

    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.evictable[block]
        self.ref_counts[block] += 1

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if block in self.block_hash:
                self.evictable[block] = None  # most recently released: evicted last
            else:
                self.plain.append(block)

    # -- the sequence API ------------------------------------------------------------------------------------
    def allocate(self, seq_id, token_ids: list[int]) -> int:
        """Blocks for a new sequence's prompt. Returns the number of its tokens found in the prefix cache.
        Raises MemoryError, changing nothing, when the free blocks do not suffice."""
        hashes = self._chain(token_ids) if self.prefix_caching else []
        hits = []
        for h in hashes:  # the longest cached prefix: stop at the first miss
            if h not in self.cached:
                break
            hits.append(self.cached[h])
        needed = math.ceil(len(token_ids) / self.block_size) - len(hits)
        revived = sum(self.ref_counts[b] == 0 for b in hits)  # free now, but this sequence takes them back
        if needed > self._num_free() - revived:
            raise MemoryError(f"{needed} blocks needed, {self._num_free() - revived} free")
        for b in hits:
            self._take(b)
        table = hits + [self._new_block() for _ in range(needed)]
        for i in range(len(hits), len(hashes)):
            self._register(table[i], hashes[i])
        self.tables[seq_id], self.tokens[seq_id] = table, list(token_ids)
        return len(hits) * self.block_size

    def append(self, seq_id, token_id: int) -> None:
        """One more token (a decode step): a new block when the last one is full; MemoryError when none is free."""
        tokens, table = self.tokens[seq_id], self.tables[seq_id]
        if len(tokens) == len(table) * self.block_size:
            if self._num_free() == 0:
                raise MemoryError("no free block")
            table.append(self._new_block())
        tokens.append(token_id)
        if len(tokens) % self.block_size == 0:  # the last block just filled: name it
            self._register(table[-1], self._chain(tokens)[-1])

    def free(self, seq_id) -> None:
        """Drop a finished (or cancelled) sequence. Its last block is released first, so a prefix's tail is
        evicted before its head."""
        for block in reversed(self.tables.pop(seq_id)):
            self._release(block)
        del self.tokens[seq_id]

    def block_table(self, seq_id) -> list[int]:
        return list(self.tables[seq_id])

    def state(self) -> dict:
        return {"free": self.plain + list(self.evictable), "ref_counts": list(self.ref_counts),
                "block_tables": {s: list(t) for s, t in self.tables.items()}}


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor) -> torch.Tensor:
    """One decode step of attention over a paged cache.

    q (B, n_head, hd); k_cache, v_cache (num_blocks, block_size, kv_heads, hd); block_tables (B, max_blocks)
    int64, padded past each sequence's blocks; context_lens (B,) tokens cached per sequence. Returns
    (B, n_head, hd): sequence b's query against its first context_lens[b] keys."""
    B, H, hd = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    L = int(context_lens.max())
    pos = torch.arange(L, device=q.device)                                      # (L,)
    blocks = block_tables[:, pos // block_size]                                 # (B, L): the block of each token
    k = k_cache[blocks, pos % block_size].float()                               # (B, L, kv_heads, hd)
    v = v_cache[blocks, pos % block_size].float()
    group = H // kv_heads
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)         # (B, L, H, hd)
    scores = torch.einsum("bhd,blhd->bhl", q.float(), k) / math.sqrt(hd)
    valid = pos[None, :] < context_lens[:, None]                                # (B, L): slots past the end
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", scores.softmax(-1), v).to(q.dtype)
