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


# Serving a checkpoint: prefill and decode at several prompt lengths and batch sizes (test_serving.py) ---------
# The tiny checkpoint every machine serves (phase-times), and the one sized for a GPU (gpu-serving: 1.0 B
# parameters, 2 GB in bf16, head_dim 128, 24 query heads sharing 8 KV heads): seconds to write, load and time.
SMALL_CHECKPOINT = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 256, "intermediate": 128,
                    "max_positions": 128}
GPU_CHECKPOINT = {"layers": 8, "hidden": 3072, "heads": 24, "kv_heads": 8, "vocab": 32000, "intermediate": 8192,
                  "max_positions": 2048}


def check_device_memory(*, before: int, held: int, peak: int, device_delta: int, kv_formula: int,
                        weights: int, source: str, what: str) -> None:
    """The serving memory figures of a GPU grade, against each other and the KV formula. `before`: bytes the
    serving process had allocated with the weights loaded; `held`: allocated after generate returned with its
    cache alive; `peak`: torch.cuda.max_memory_allocated over the call, all three from the device's allocator
    (`source` "device"); `device_delta`: the device memory the judge saw taken over the call (mem_get_info,
    every process); `kv_formula`: 2 x layers x KV heads x head_dim x cached tokens x bytes per element x batch at
    the dtype held; `weights`: the model's bytes. A figure taken on the host (the process's RSS, sizes of
    tensors in host memory) is not device memory and fails, as does a cache that is not on the device."""
    if source != "device":
        raise LabCheckFailed(f"{what}: the memory figure came from {source}; on a GPU the serving memory is the "
                             "device's (torch.cuda.max_memory_allocated, torch.cuda.memory_allocated): host memory "
                             "(RSS, sizes of tensors on the CPU) says nothing of what the GPU holds")
    if before < weights:
        raise LabCheckFailed(f"{what}: {before} bytes were allocated on the device before the call, less than the "
                             f"model's {weights} bytes of weights: the weights are not on the device")
    cache = held - before
    if cache < 0.99 * kv_formula:
        raise LabCheckFailed(
            f"{what}: with your cache alive after generate, the device holds {cache} bytes more than before the "
            f"call; the cache's K and V take {kv_formula} bytes by the formula (2 x layers x KV heads x head_dim x "
            "tokens x bytes per element x batch). Keep the cache on the model's device "
            "(next(model.parameters()).device), in the model's dtype")
    if peak < before + kv_formula:
        raise LabCheckFailed(f"{what}: the device's peak allocation over the call ({peak} bytes) is below the "
                             f"weights and the cache ({before} + {kv_formula}): not a figure of this call")
    if device_delta < 0.9 * cache - 64 * 2**20:
        raise LabCheckFailed(
            f"{what}: the serving process says it holds {cache} bytes more after the call, but the device shows "
            f"{device_delta} bytes more in use (torch.cuda.mem_get_info, read by the judge): the figures are not "
            "the device's")
