"""End to end: greedy generation with the kit's GPT (grouped KV heads) through your allocator and your
paged_attention equals the kit's full recomputation. The course's kit.paged_generation keeps the paged K and V
tensors and computes the model's other pieces; your allocator places every token (prefix caching on, prompts
sharing a prefix, so the later prompts' shared tokens are NOT computed again: their keys and values are read from
the blocks your cache shared), and your paged_attention runs every decode step's attention."""
import random

import pytest
import torch

from infracourse.grader import LabCheckFailed
from infracourse.kit.generate import greedy_generate
from infracourse.kit.gpt import GPTConfig
from infracourse.kit.paged_generation import InvalidAnswer, PagedGeneration

BLOCK, BLOCKS, NEW = 4, 40, 6


@pytest.mark.check("paged-generation")
def test_generation_through_your_cache(paged, seed, device):
    r = random.Random(seed)
    cfg = GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_head=4, n_kv_head=2, n_layer=2)
    gen = PagedGeneration(paged, seed=seed, blocks=BLOCKS, block_size=BLOCK, prefix_caching=True, cfg=cfg,
                          device=device)
    prefix = [r.randrange(256) for _ in range(2 * BLOCK + 1)]
    for i in range(3):
        prompt = prefix + [r.randrange(256) for _ in range(r.randint(2, 2 * BLOCK))]
        what = (f"seed {seed}: prompt {i + 1} of 3 ({len(prompt)} tokens, the first {len(prefix)} shared), "
                f"{BLOCK}-token blocks, {cfg.n_head} heads sharing {cfg.kv_heads} KV heads")
        try:
            run = gen.generate(f"p{i}", prompt, NEW)
        except InvalidAnswer as exc:
            raise LabCheckFailed(f"{what}: {exc}") from None
        with torch.no_grad():
            want = greedy_generate(gen.model, prompt, NEW)
        if run.tokens != want:
            j = next(j for j, (a, b) in enumerate(zip(run.tokens, want)) if a != b)
            raise LabCheckFailed(
                f"{what}: generation through your block table and paged_attention gives token {j} = "
                f"{run.tokens[j]}, full recomputation {want[j]} (your allocate reported {run.cached} cached tokens). "
                "The blocks you share must hold exactly this prompt's prefix; every appended token needs its slot")
