"""KV-cache size: the learner's formula against the course's, and the cache's real tensors against both."""
import dataclasses
import random

import pytest
import torch

from infracourse.grader import LabCheckFailed, in_worker
from infracourse.kit.generate import seeded_prompts
from infracourse.kit.gpt import GPTConfig
from week15_judging import TIMING_CFG, TIMING_NEW, TIMING_PROMPT, call_generate, models, seeded_config

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)
LARGE = [GPTConfig(vocab_size=32000, seq_len=4096, d_model=4096, n_head=32, n_kv_head=8, n_layer=32),   # GQA 8B
         GPTConfig(vocab_size=50304, seq_len=1024, d_model=768, n_head=12, n_layer=12)]                   # GPT-2 small


def course_kv_bytes(cfg: GPTConfig, tokens: int, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x KV heads x head_dim x cached tokens x bytes per element."""
    return 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * tokens * torch.empty((), dtype=dtype).element_size()


def learner_kv_bytes(kv, cfg, tokens, dtype):
    config = in_worker(GPTConfig, **dataclasses.asdict(cfg))
    got = kv.kv_bytes(config, tokens, dtype)
    if type(got) is not int:
        raise LabCheckFailed(f"kv_bytes must return a whole number of bytes (int), got {got!r:.100}")
    return got


@pytest.mark.check("kv-bytes-formula")
def test_formula(kv, seed):
    r = random.Random(seed)
    cases = [(cfg, r.randint(1, 8192), dtype) for cfg in LARGE + [seeded_config(seed), seeded_config(seed + 1)]
             for dtype in DTYPES[:2]] + [(LARGE[0], 4096, DTYPES[3]), (LARGE[0], 1, DTYPES[2])]
    for cfg, tokens, dtype in cases:
        want, got = course_kv_bytes(cfg, tokens, dtype), learner_kv_bytes(kv, cfg, tokens, dtype)
        if got != want:
            hint = ""
            if cfg.kv_heads != cfg.n_head and got == want // cfg.kv_heads * cfg.n_head:
                hint = (f" Your figure counts all {cfg.n_head} query heads: only the {cfg.kv_heads} key/value heads "
                        "are cached (grouped-query attention shares each among several query heads).")
            raise LabCheckFailed(
                f"kv_bytes({cfg.n_layer} layers, {cfg.n_head} heads, {cfg.kv_heads} KV heads, head_dim {cfg.head_dim}, "
                f"{tokens} tokens, {dtype}) = {got}, expected {want} = 2 x layers x KV heads x head_dim x tokens x "
                f"bytes per element.{hint}")


@torch.no_grad()
def _require_cached_values(local, ids, tensors, length, dtype, what):
    """The tensors hold the keys and values the full sequence computes, layer by layer (no stand-ins)."""
    x = local.embed(torch.tensor([ids[:length]]))
    rtol, atol = (1e-4, 1e-4) if dtype == torch.float32 else (3e-2, 3e-2)
    for layer, block in enumerate(local.blocks):
        _, k, v = block.attn.qkv_heads(block.norm1(x))
        for name, want, got in (("K", k, tensors[2 * layer]), ("V", v, tensors[2 * layer + 1])):
            if not torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol):
                err = (got.float() - want.float()).abs().max().item()
                raise LabCheckFailed(f"{what}: tensors()[{2 * layer + (name == 'V')}] should be layer {layer}'s {name} "
                                     f"for the {length} cached tokens, in the order [K0, V0, K1, V1, ...]; it differs "
                                     f"from the full sequence's by up to {err:.2e}")
        x = x + block.attn(block.norm1(x))
        x = x + block.mlp(block.norm2(x))


@pytest.mark.check("cache-bytes")
def test_cache_real_size(kv, learner, seed, record):
    cases = [(seeded_config(seed), torch.float32, 20, 9), (seeded_config(seed + 7), torch.bfloat16, 13, 6),
             (TIMING_CFG, torch.float32, TIMING_PROMPT, TIMING_NEW)]
    for cfg, dtype, p, n in cases:
        local, remote = models(learner, cfg, seed, dtype)
        prompt = seeded_prompts(1, cfg.vocab_size, p, p, seed=seed)[0]
        what = (f"seed {seed}, {cfg.n_layer} layers, {cfg.kv_heads} KV heads of head_dim {cfg.head_dim}, {dtype}, a "
                f"prompt of {p} tokens and {n} new")
        tokens, _, cache = call_generate(kv, remote, prompt, n, what)
        tensors = cache.tensors()
        if not isinstance(tensors, list) or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise LabCheckFailed(f"{what}: cache.tensors() must return a list of tensors, got {tensors!r:.200}")
        if len(tensors) != 2 * cfg.n_layer:
            raise LabCheckFailed(f"{what}: cache.tensors() returned {len(tensors)} tensors; expected K and V of "
                                 f"each of the {cfg.n_layer} layers ({2 * cfg.n_layer})")
        lengths = {t.shape[2] if t.dim() == 4 else -1 for t in tensors}
        shapes = sorted({tuple(t.shape) for t in tensors})
        if len(lengths) != 1 or any(t.dim() != 4 or tuple(t.shape[:2]) != (1, cfg.kv_heads)
                                    or t.shape[3] != cfg.head_dim for t in tensors):
            raise LabCheckFailed(f"{what}: every cached K and V must be (1, KV heads {cfg.kv_heads}, cached tokens, "
                                 f"head_dim {cfg.head_dim}), all with the same length; got shapes {shapes[:4]}")
        length = lengths.pop()
        if length not in (p + n - 1, p + n):
            raise LabCheckFailed(f"{what}: the cache holds {length} tokens; after {n} new tokens it holds the prompt "
                                 f"and the new tokens fed back: {p + n - 1} (or {p + n} if the last is fed too)")
        if any(t.dtype != dtype for t in tensors):
            raise LabCheckFailed(f"{what}: the cache is {tensors[0].dtype}; keep it in the model's dtype {dtype}")
        _require_cached_values(local, prompt + tokens, tensors, length, dtype, what)
        real = sum(t.numel() * t.element_size() for t in tensors)
        if any(t.untyped_storage().nbytes() < t.numel() * t.element_size() for t in tensors):
            raise LabCheckFailed(f"{what}: a cache tensor's storage is smaller than the tensor (expanded views?)")
        formula, theirs = course_kv_bytes(cfg, length, dtype), learner_kv_bytes(kv, cfg, length, dtype)
        if not real == formula == theirs:
            raise LabCheckFailed(f"{what}: the cache's tensors hold {real} bytes for {length} tokens; the course's "
                                 f"formula gives {formula}, your kv_bytes {theirs}: all three must be equal")
    record("cache bytes", real, unit="B", model=f"timing workload, {length} cached tokens, fp32")
