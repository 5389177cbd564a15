"""Attention over a paged cache equals the course's attention over the same keys and values laid out contiguously
(infracourse.kit.paged_reference.contiguous_attention), for seeded context lengths mostly not multiples of the
block size, scattered block tables, grouped KV heads, and garbage in every slot no sequence owns."""
import math
import random

import pytest
import torch

from infracourse.grader import LabCheckFailed, assert_close
from infracourse.kit.paged_reference import contiguous_attention

CASES = [  # (n_head, kv_heads, head_dim, block_size, dtype)
    (4, 4, 16, 4, torch.float32),
    (8, 2, 16, 8, torch.float32),
    (6, 3, 8, 16, torch.bfloat16),
]


def paged_case(seed: int, n_head: int, kv_heads: int, hd: int, bs: int, dtype):
    r = random.Random(seed)
    lens = [1, bs, r.randint(2, 3 * bs) | 1] + [r.randint(bs + 1, 5 * bs) for _ in range(2)]
    lens = [n + 1 if n % bs == 0 and n > bs else n for n in lens]  # one exact multiple (bs) kept, the rest not
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(kv_heads, n, hd, generator=g).to(dtype) for n in lens]
    values = [torch.randn(kv_heads, n, hd, generator=g).to(dtype) for n in lens]
    q = torch.randn(len(lens), n_head, hd, generator=g).to(dtype)
    need = [math.ceil(n / bs) for n in lens]
    num_blocks = sum(need) + 3
    # garbage everywhere no sequence owns (large, so reading one slot too many shows)
    k_cache = (torch.rand(num_blocks, bs, kv_heads, hd, generator=g) * 40 + 20).to(dtype)
    v_cache = (torch.rand(num_blocks, bs, kv_heads, hd, generator=g) * 40 + 20).to(dtype)
    order = list(range(num_blocks))
    r.shuffle(order)
    tables = torch.zeros(len(lens), max(need), dtype=torch.int64)
    for b, n in enumerate(lens):
        blocks, order = order[:need[b]], order[need[b]:]
        tables[b, :need[b]] = torch.tensor(blocks)
        for p in range(n):
            k_cache[blocks[p // bs], p % bs] = keys[b][:, p]
            v_cache[blocks[p // bs], p % bs] = values[b][:, p]
    return q, k_cache, v_cache, tables, torch.tensor(lens), keys, values


@pytest.mark.check("paged-attention")
def test_paged_attention_equals_contiguous(paged, seed, device):
    for i, (n_head, kv_heads, hd, bs, dtype) in enumerate(CASES):
        q, k_cache, v_cache, tables, lens, keys, values = paged_case(seed + i, n_head, kv_heads, hd, bs, dtype)
        what = (f"seed {seed + i}: {n_head} query heads, {kv_heads} KV heads, head_dim {hd}, block size {bs}, "
                f"{dtype}, context lengths {lens.tolist()}")
        out = paged.paged_attention(*(t.to(device) for t in (q, k_cache, v_cache, tables, lens)))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise LabCheckFailed(f"{what}: paged_attention must return (B, n_head, head_dim) = {tuple(q.shape)}, "
                                 f"got {shape}")
        out, want = out.cpu(), contiguous_attention(q, keys, values)
        bad = [b for b in range(len(keys)) if not torch.allclose(out[b].float(), want[b].float(), rtol=2e-2, atol=2e-2)]
        if bad:
            b = bad[0]
            n = int(lens[b])
            raise LabCheckFailed(
                f"{what}: sequence {b} ({n} tokens, {math.ceil(n / bs)} blocks, the last holding {(n - 1) % bs + 1}) "
                "differs from attention over its keys and values laid out contiguously. Token p sits in slot "
                "p % block_size of block block_tables[b][p // block_size]; read exactly context_lens[b] tokens "
                "(the last block is partial: slots past the end hold other data)")
        assert_close(out, want, what=what)
