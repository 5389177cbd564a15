"""Each drill estimate's formula (curriculum/drills) against a computation that does not share it: tensor
nbytes on the meta device, parameters of real modules, the course's ZeRO accounting (kit.sharding), a ring
all-reduce simulated chunk by chunk, a roofline from the two roofs, and the definitions of 003 §9."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from infracourse.course import Course
from infracourse.drills import content, engine, measured
from infracourse.kit.sharding import memory_per_device

SEEDS = range(8)
DTYPES = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


def _meta_bytes(*shape, bpe) -> int:
    if bpe == 0.5:  # int4: two values a byte
        return torch.empty(math.prod(shape) // 2, dtype=torch.uint8, device="meta").nbytes
    return torch.empty(*shape, dtype=DTYPES[int(bpe)], device="meta").nbytes


def _kv_cache(v):
    k = torch.empty(int(v["layers"]), int(v["batch"]), int(v["kv_heads"]), int(v["ctx"]), int(v["head_dim"]),
                    dtype=torch.bfloat16 if v["bpe"] == 2 else torch.float8_e4m3fn, device="meta")
    return 2 * k.nbytes  # a K and a V tensor per layer


def _ring_allreduce_seconds(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Simulate reduce-scatter then all-gather on a ring: every step each rank sends one chunk; the step
    lasts alpha plus the chunk's time on the link."""
    chunks = [nbytes / p] * p
    seconds, steps = 0.0, 0
    for _phase in ("reduce-scatter", "all-gather"):
        for step in range(p - 1):
            sent = max(chunks[(rank - step) % p] for rank in range(p))
            seconds += alpha + sent / beta
            steps += 1
    assert steps == 2 * (p - 1)
    return seconds


def _mlp(v):
    d, mult = int(v["d"]), int(v["mult"])
    block = nn.Sequential(nn.Linear(d, mult * d), nn.Linear(mult * d, d)).to("meta")
    return sum(p.numel() for p in block.parameters())


def _roof(flops, nbytes, peak, bw):
    return max(flops / peak, nbytes / bw)


INDEPENDENT = {
    "tensor-nbytes": lambda v: _meta_bytes(int(v["a"]), int(v["b"]), int(v["c"]), bpe=v["bpe"]),
    "mem-inference": lambda v: _meta_bytes(int(v["params_b"] * 1e9), bpe=v["bpe"]),
    "mlp-params": _mlp,
    "kv-cache-bytes": _kv_cache,
    "kv-per-token": lambda v: _kv_cache({**v, "batch": 1, "ctx": 1, "bpe": 2}),
    "zero-per-device": lambda v: memory_per_device(int(v["params_b"] * 1e9), int(v["world"]), int(v["stage"]),
                                                   "bf16-mixed")["total"],
    "mem-training-mixed": lambda v: memory_per_device(int(v["params_b"] * 1e9), 1, 0, "bf16-mixed")["total"],
    "st-memory": lambda v: memory_per_device(int(v["params_m"] * 1e6), 1, 0, "fp32")["total"],
    "ring-allreduce-time": lambda v: 1e3 * _ring_allreduce_seconds(v["mib"] * 2 ** 20, int(v["p"]),
                                                                   v["alpha_us"] * 1e-6, v["beta"] * 1e9),
    "hierarchical-allreduce-time": lambda v: 1e3 * (
        _ring_allreduce_seconds(v["mib"] * 2 ** 20, int(v["g"]), v["a_in"] * 1e-6, v["b_in"] * 1e9)
        + _ring_allreduce_seconds(v["mib"] * 2 ** 20 / v["g"], int(v["nodes"]), v["a_out"] * 1e-6, v["b_out"] * 1e9)),
    "gemm-intensity": lambda v: (2 * v["m"] * v["n"] * v["k"]) / (
        _meta_bytes(int(v["m"]), int(v["k"]), bpe=v["bpe"]) + _meta_bytes(int(v["k"]), int(v["n"]), bpe=v["bpe"])
        + _meta_bytes(int(v["m"]), int(v["n"]), bpe=v["bpe"])),
    "gemm-time-bound": lambda v: 1e3 * _roof(2 * v["m"] * v["n"] * v["k"],
                                             2 * (v["m"] * v["k"] + v["k"] * v["n"] + v["m"] * v["n"]),
                                             v["peak"] * 1e12, v["bw"] * 1e12),
    "roofline-attainable": lambda v: min(v["peak"] * 1e12, v["intensity"] * v["bw"] * 1e12) / 1e12,
    "ridge-point": lambda v: (v["peak"] * 1e12) / (v["bw"] * 1e12),
    "strong-scaling": lambda v: 100 * (v["t1"] / v["tn"]) / v["n"],  # speed-up over devices
    "weak-scaling": lambda v: 100 * v["t1"] / v["tn"],
    "mfu-from-tokens": lambda v: 100 * (v["ktok"] * 1e3 * 3 * (2 * v["params_b"] * 1e9)) / (v["gpus"] * v["peak"] * 1e12),
    "littles-law-concurrency": lambda v: v["rate"] * (v["latency_ms"] / 1e3),
    "goodput": lambda v: sum(1 for i in range(int(v["done"])) if i >= v["late"]) / v["duration"],
    "cost-per-request": lambda v: (v["gpus"] * v["price"]) / (v["rate"] * 3600 * (1 - v["fail"] / 100)),  # an hour's
    "cost-per-mtok": lambda v: v["price"] * (1e6 / (v["tok_s"] * v["busy"] / 100)) / 3600,
    "pipeline-bubble": lambda v: 100 * (v["p"] - 1) / (v["m"] + v["p"] - 1),
    "speculative-accept": lambda v: sum(v["a"] ** i for i in range(int(v["k"]) + 1)),
}
# every estimate kind 003 §9 lists has at least one question checked here
NINE = {"memory-inference", "memory-training", "memory-zero", "kv-cache", "intensity", "roofline", "allreduce-ring",
        "allreduce-hierarchical", "scaling", "mfu", "capacity", "cost"}


@pytest.fixture(scope="module")
def questions():
    root = Course().root
    return {q.id: q for q in content.load(root) + content.load(root, selftest=True)}


@pytest.mark.parametrize("qid", sorted(INDEPENDENT))
def test_formula_matches_an_independent_computation(questions, qid):
    q = questions[qid]
    for seed in SEEDS:
        inst = engine.instantiate(q, seed, measured.examples(q) if q.kind == "measured" else None)
        want = INDEPENDENT[qid](inst.values)
        assert math.isclose(inst.expected, want, rel_tol=1e-9), (qid, seed, inst.values, inst.expected, want)


def test_every_section_9_estimate_is_checked(questions):
    checked = {questions[q].estimate for q in INDEPENDENT}
    assert NINE <= checked, f"no independent check for {sorted(NINE - checked)}"
    generated = {q.estimate for q in questions.values() if q.numeric and q.params}
    assert NINE <= generated, f"no parameter generator for {sorted(NINE - generated)}"
