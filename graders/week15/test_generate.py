"""Cached generation reproduces the kit's full-recomputation greedy generation: the same tokens, the same logits
within fp32 tolerance, on configurations and prompts drawn from the grade's seed."""
import random

import pytest
import torch

from infracourse.grader import LabCheckFailed
from infracourse.kit.generate import greedy_generate, seeded_prompts
from week15_judging import call_generate, models, seeded_config

RTOL, ATOL = 1e-4, 1e-4


@pytest.mark.check("cached-tokens")
def test_cached_generation_equals_full_recomputation(kv, learner, seed):
    cfg = seeded_config(seed)
    local, remote = models(learner, cfg, seed)
    r = random.Random(seed)
    prompts = seeded_prompts(3, cfg.vocab_size, 1, 30, seed=seed) + [[r.randrange(256)]]
    for prompt in prompts:
        n = r.randint(8, cfg.seq_len - len(prompt))
        what = (f"seed {seed}, {cfg.n_layer} layers, {cfg.n_head} heads, {cfg.kv_heads} KV heads, d_model "
                f"{cfg.d_model}: a prompt of {len(prompt)} tokens, {n} new")
        tokens, logits = greedy_generate(local, prompt, n, return_logits=True)
        got, got_logits, _ = call_generate(kv, remote, prompt, n, what)
        if got != tokens:
            i = next(i for i, (a, b) in enumerate(zip(got, tokens)) if a != b)
            raise LabCheckFailed(
                f"{what}: your token {i} is {got[i]}, full recomputation gives {tokens[i]} (tokens before it agree). "
                f"{'The prompt itself (prefill) already differs: check prefill. ' if i == 0 else ''}"
                "A decode step must run the new token at its own position (offset = tokens already cached) and "
                "attend to every cached key and value plus its own")
        err = (got_logits.float() - logits).abs().max().item()
        if not torch.allclose(got_logits.float(), logits, rtol=RTOL, atol=ATOL):
            raise LabCheckFailed(f"{what}: tokens agree but your logits differ from full recomputation by up to "
                                 f"{err:.2e} (tolerance {ATOL:g} + {RTOL:g} x |logit|): the cached keys and values "
                                 "must be exactly those the full sequence would compute")
