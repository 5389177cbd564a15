"""End to end: greedy generation with the kit's GPT (grouped KV heads) through your allocator and your
paged_attention equals the kit's full recomputation. The grader keeps the paged K and V tensors and computes
the model's other pieces; your allocator places every token (prefix caching on, prompts sharing a prefix, so the
later prompts' shared tokens are NOT computed again: their keys and values are read from the blocks your cache
shared), and your paged_attention runs every decode step's attention."""
import random

import pytest
import torch

from infracourse.guard import LabCheckFailed
from infracourse.kit.generate import greedy_generate
from infracourse.kit.gpt import GPT, GPTConfig

BLOCK, BLOCKS, NEW = 4, 40, 6


def write(cache, table, start, kv):
    """kv (kv_heads, T, hd) into the slots of positions start .. start + T - 1."""
    for t in range(kv.shape[1]):
        p = start + t
        cache[table[p // BLOCK], p % BLOCK] = kv[:, t]


def gather(cache, table, n):
    """(1, kv_heads, n, hd): positions 0 .. n - 1 read through the table."""
    return torch.stack([cache[table[p // BLOCK], p % BLOCK] for p in range(n)], 1)[None]


@pytest.mark.check("paged-generation")
def test_generation_through_your_cache(paged, seed, device):
    with torch.no_grad():
        generate_through(paged, seed, device)


def generate_through(paged, seed, device):
    r = random.Random(seed)
    cfg = GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_head=4, n_kv_head=2, n_layer=2)
    model = GPT(cfg, seed=seed).eval()
    kv_shape = (BLOCKS, BLOCK, cfg.kv_heads, cfg.head_dim)
    k_caches = [torch.zeros(kv_shape) for _ in model.blocks]
    v_caches = [torch.zeros(kv_shape) for _ in model.blocks]
    alloc = paged.BlockAllocator(BLOCKS, BLOCK, True)
    prefix = [r.randrange(256) for _ in range(2 * BLOCK + 1)]
    for i in range(3):
        prompt = prefix + [r.randrange(256) for _ in range(r.randint(2, 2 * BLOCK))]
        what = (f"seed {seed}: prompt {i + 1} of 3 ({len(prompt)} tokens, the first {len(prefix)} shared), "
                f"{BLOCK}-token blocks, {cfg.n_head} heads sharing {cfg.kv_heads} KV heads")
        cached = alloc.allocate(f"p{i}", prompt)
        if type(cached) is not int or not 0 <= cached < len(prompt):
            raise LabCheckFailed(f"{what}: allocate returned {cached!r} cached tokens")
        table = alloc.block_table(f"p{i}")
        # prefill the tokens not cached; the cached ones' K and V are read from the shared blocks
        x = model.embed(torch.tensor([prompt[cached:]]), cached)
        for block, kc, vc in zip(model.blocks, k_caches, v_caches):
            q, k, v = block.attn.qkv_heads(block.norm1(x))
            write(kc, table, cached, k[0])
            write(vc, table, cached, v[0])
            x = x + block.attn.attend(q, gather(kc, table, len(prompt)), gather(vc, table, len(prompt)))
            x = x + block.mlp(block.norm2(x))
        tokens, n = [], len(prompt)
        token = int(model.logits(x)[0, -1].argmax())
        for _ in range(NEW):
            tokens.append(token)
            alloc.append(f"p{i}", token)
            table = alloc.block_table(f"p{i}")
            x = model.embed(torch.tensor([[token]]), n)
            n += 1
            for block, kc, vc in zip(model.blocks, k_caches, v_caches):
                q, k, v = block.attn.qkv_heads(block.norm1(x))
                write(kc, table, n - 1, k[0])
                write(vc, table, n - 1, v[0])
                args = (q[:, :, 0], kc, vc, torch.tensor([table]), torch.tensor([n]))
                out = paged.paged_attention(*(t.to(device) for t in args))  # your kernel runs on the GPU if any
                x = x + block.attn.proj(out.cpu().reshape(1, 1, cfg.d_model).float())
                x = x + block.mlp(block.norm2(x))
            token = int(model.logits(x)[0, -1].argmax())
        want = greedy_generate(model, prompt, NEW)
        if tokens != want:
            j = next(j for j, (a, b) in enumerate(zip(tokens, want)) if a != b)
            raise LabCheckFailed(
                f"{what}: generation through your block table and paged_attention gives token {j} = {tokens[j]}, "
                f"full recomputation {want[j]} (your allocate reported {cached} cached tokens). The blocks you "
                "share must hold exactly this prompt's prefix; every appended token needs its slot")
