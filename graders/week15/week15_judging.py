"""The shared judging helpers of the week15 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
import dataclasses
import random

import torch

from infracourse.grader import LabCheckFailed, in_worker
from infracourse.kit import gpt
from infracourse.kit.gpt import GPT, GPTConfig


# The timed workload (fixed, so the report's figures can be compared with this grade's measurement).
TIMING_CFG = GPTConfig(vocab_size=256, seq_len=400, d_model=128, n_head=8, n_kv_head=2, n_layer=4)
TIMING_PROMPT, TIMING_NEW = 384, 16


def seeded_config(seed: int) -> GPTConfig:
    """A small configuration drawn from the grade's seed, with grouped KV heads most of the time."""
    r = random.Random(seed)
    n_head = r.choice((2, 4, 6, 8))
    kv = r.choice([d for d in range(1, n_head + 1) if n_head % d == 0 and d < n_head] or [n_head])
    return GPTConfig(vocab_size=256, seq_len=64, d_model=n_head * r.choice((8, 16)), n_head=n_head, n_kv_head=kv,
                     n_layer=r.randint(1, 3), mlp_ratio=r.choice((2, 4)))


def models(learner, cfg: GPTConfig, seed: int, dtype: torch.dtype = torch.float32):
    """(the judge's model, the same model built in the worker), weights from `seed`."""
    local = GPT(cfg, seed=seed).to(dtype)
    config = in_worker(GPTConfig, **dataclasses.asdict(cfg))
    remote = learner.build(gpt.GPT, config, seed=seed)
    if dtype != torch.float32:
        remote = remote.to(dtype)
    return local, remote


def call_generate(kv, model, prompt: list[int], n: int, what: str):
    """generate(model, prompt, n) -> (tokens, logits, cache), its shape checked; the cache stays in the worker."""
    out = kv.generate(model, prompt, n)
    if not isinstance(out, tuple) or len(out) != 3:
        raise LabCheckFailed(f"{what}: generate must return (tokens, logits, cache), got {type(out).__name__}")
    tokens, logits, cache = out
    if not isinstance(tokens, list) or len(tokens) != n or not all(type(t) is int for t in tokens):
        raise LabCheckFailed(f"{what}: tokens must be a list of {n} ints, got {tokens!r:.200}")
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (n, 256):
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise LabCheckFailed(f"{what}: logits must be a ({n}, vocab 256) tensor, one row per new token, got {shape}")
    return tokens, logits, cache


def follows_greedy(local, prompt: list[int], tokens: list[int]) -> bool:
    """Whether `tokens` are the greedy continuation of `prompt`: one teacher-forced forward pass of the kit model
    over prompt + tokens, each token the argmax at the position before it (what greedy generation computes)."""
    if not isinstance(tokens, list) or not tokens or not all(type(t) is int for t in tokens):
        return False
    ids = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        best = local(ids)[0, len(prompt) - 1:].float().argmax(-1).tolist()
    return best == tokens
