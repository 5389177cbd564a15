"""Week 6 memory: the learner's estimate against what is actually allocated.

Parameters, gradients and Adam state are counted exactly on the meta device (shapes and dtypes, no data):
a forward and backward pass there makes the gradients autograd really creates, an AdamW step the states it
really keeps. Activations are the bytes autograd saves for backward, seen through saved_tensors_hooks
on a real CPU forward pass. On a GPU the estimated total is held against torch.cuda.max_memory_allocated.
Besides the fixed configurations, each grade draws one from its seed (a table of answers cannot know it),
and every estimate is watched: an estimate computes from the configuration's numbers and runs no tensor op
(building the model, even on the meta device, or running it is measuring, not estimating).
"""
import dataclasses
import functools
import random

import pytest
import torch

from infracourse.grader import CallRecord, LabCheckFailed, in_worker
from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch

KEYS = ("params", "grads", "optimizer", "activations", "total")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COUNT_CONFIGS = [GPTConfig(), GPTConfig(vocab_size=1000, seq_len=100, d_model=48, n_head=3, n_layer=3, mlp_ratio=2),
                 GPTConfig(vocab_size=50304, seq_len=1024, d_model=768, n_head=12, n_layer=12)]
ACTIVATION_CASES = [(GPTConfig(), 8), (GPTConfig(vocab_size=1024, seq_len=32, d_model=32, n_head=2, n_layer=3,
                                                 mlp_ratio=2), 4),
                    (GPTConfig(vocab_size=128, seq_len=128, d_model=96, n_head=6, n_layer=1), 2)]
ACTIVATION_RTOL = 0.10


def seeded_case(seed: int) -> tuple[GPTConfig, int]:
    """A small configuration and batch drawn from the grade's seed."""
    r = random.Random(seed)
    heads, head_dim = r.choice((1, 2, 3, 4)), r.choice((8, 16, 24))
    cfg = GPTConfig(vocab_size=r.randint(40, 700), seq_len=r.randint(5, 48), d_model=heads * head_dim,
                    n_head=heads, n_layer=r.randint(1, 3), mlp_ratio=r.choice((1, 2, 4)))
    return cfg, r.randint(1, 4)


@pytest.fixture(scope="module")
def memory(learner):
    return learner.module("memory")


def estimate(memory, cfg, batch, precision="fp32", master_weights=False) -> dict:
    config = in_worker(GPTConfig, **dataclasses.asdict(cfg))  # built in the worker
    result = memory.estimate_memory.call((config, batch), {"precision": precision, "master_weights": master_weights},
                                         watch={"poison": False})
    got, record = result.value, CallRecord.from_evidence(result.record)
    what = f"estimate_memory(batch={batch}, precision={precision!r}, master_weights={master_weights})"
    ran = sorted(set(record.ops) | set(record.profiled))
    if ran:
        raise LabCheckFailed(f"{what} ran torch ops {ran[:8]}: an estimate is arithmetic on cfg's numbers (sizes "
                             "times bytes per element), with no model built, not even on the meta device, and no "
                             "tensor made; check your formula against the meta device outside estimate_memory")
    if not isinstance(got, dict) or set(got) != set(KEYS):
        raise LabCheckFailed(f"{what} must return a dict with exactly the keys {list(KEYS)}, got {got!r:.200}")
    if any(type(got[k]) is not int or got[k] < 0 for k in KEYS):
        raise LabCheckFailed(f"{what}: every value must be a whole number of bytes (int >= 0), got {got}")
    if got["total"] != sum(got[k] for k in KEYS[:-1]):
        raise LabCheckFailed(f"{what}: total {got['total']} is not the sum of the four parts")
    return got


@functools.lru_cache(maxsize=None)  # the three exact checks share the counts
def meta_counts(cfg: GPTConfig, precision: str, master_weights: bool) -> dict:
    """Bytes of parameters, gradients and AdamW state, measured on the meta device."""
    with torch.device("meta"):
        model = GPT(cfg).to(DTYPES[precision])
        idx = torch.zeros(1, min(8, cfg.seq_len), dtype=torch.long)  # any length the model takes
        model(idx, idx)[1].backward()
        params = list(model.parameters())  # a tied matrix is one parameter
        updated = params
        if master_weights:  # the optimiser updates fp32 copies; the model's weights are rounded from them
            updated = [p.detach().float().requires_grad_() for p in params]
            for master, p in zip(updated, params):
                master.grad = p.grad.float()
        optimizer = torch.optim.AdamW(updated)
        try:
            optimizer.step()
        except RuntimeError as exc:
            # torch <= 2.11 reads the step count with .item(), which meta tensors refuse. The state tensors this
            # count needs were created before that line; anything else is a real error.
            if "meta tensors" not in str(exc) or len(optimizer.state) != len(updated):
                raise
    states = sum(t.nbytes for s in optimizer.state.values() for k, t in s.items() if k != "step")
    return {"params": sum(p.nbytes for p in params), "grads": sum(p.grad.nbytes for p in params),
            "optimizer": states + (sum(m.nbytes for m in updated) if master_weights else 0),
            "parameters": sum(p.numel() for p in params)}


def require_exact(memory, part: str, cases, advice: str, seed: int) -> None:
    for cfg in COUNT_CONFIGS + [seeded_case(seed)[0]]:
        for precision, master in cases:
            measured = meta_counts(cfg, precision, master)
            got = estimate(memory, cfg, 8, precision, master)[part]
            if got != measured[part]:
                n = measured["parameters"]
                raise LabCheckFailed(
                    f"{part} for {cfg} in {precision}{' with fp32 master weights' if master else ''}: estimated "
                    f"{got:,} bytes ({got / n:.3g} per parameter), counted {measured[part]:,} on the meta device "
                    f"({n:,} parameters, {measured[part] / n:g} bytes each). {advice}")


@pytest.mark.check("memory-params")
def test_params(memory, seed):
    require_exact(memory, "params", [("fp32", False), ("bf16", False)],
                  "Count every weight matrix and norm vector; the output head shares the token embedding's matrix.",
                  seed)


@pytest.mark.check("memory-grads")
def test_grads(memory, seed):
    require_exact(memory, "grads", [("fp32", False), ("bf16", False)],
                  "Autograd makes one gradient per parameter, in that parameter's dtype.", seed)


@pytest.mark.check("memory-optimizer")
def test_optimizer(memory, seed):
    require_exact(memory, "optimizer", [("fp32", False), ("bf16", False), ("bf16", True)],
                  "Adam keeps two moments per parameter (exp_avg and exp_avg_sq) in the dtype of the weights it "
                  "updates; with master weights it updates an fp32 copy of each parameter, held as well.", seed)


def saved_for_backward(cfg: GPTConfig, batch: int, dtype) -> tuple[int, list]:
    """Bytes of the distinct non-parameter storages autograd saves in one forward pass, and the largest ones."""
    model = GPT(cfg).to(dtype)
    inputs, targets = synthetic_batch(cfg, batch, seed=0)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:  # q, k and v are views of one qkv tensor: a storage counts once
            seen.setdefault(ptr, (t.untyped_storage().nbytes(), tuple(t.shape), str(t.dtype).replace("torch.", "")))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(inputs, targets)
    return sum(n for n, _, _ in seen.values()), sorted(seen.values(), reverse=True)


@pytest.mark.check("memory-activations")
def test_activations(memory, record, seed):
    worst = 0.0
    for cfg, batch in ACTIVATION_CASES + [seeded_case(seed)]:
        for precision, dtype in DTYPES.items():
            measured, largest = saved_for_backward(cfg, batch, dtype)
            got = estimate(memory, cfg, batch, precision)["activations"]
            error = abs(got - measured) / measured
            worst = max(worst, error)
            if error > ACTIVATION_RTOL:
                kinds = "; ".join(f"{shape} {dtype} ({n:,} B)" for n, shape, dtype in largest[:6])
                raise LabCheckFailed(
                    f"activations for {cfg}, batch {batch}, {precision}: estimated {got:,} bytes, autograd saved "
                    f"{measured:,} ({error:.0%} off, allowed {ACTIVATION_RTOL:.0%}). Largest saved tensors: {kinds}. "
                    "Find what each op saves with torch.autograd.graph.saved_tensors_hooks.")
    record("worst activation error", worst, target=ACTIVATION_RTOL)


@pytest.mark.check("memory-gpu-peak")
def test_gpu_peak(memory, record, seed):
    # large enough that activations and states dwarf the allocator's workspace and rounding
    cfg, batch = GPTConfig(vocab_size=256, seq_len=512, d_model=512, n_head=8, n_layer=8), 8
    model = GPT(cfg).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    inputs, targets = synthetic_batch(cfg, batch, seed=seed, device="cuda")
    model(inputs, targets)[1].backward()
    optimizer.step()  # Adam's states now exist
    optimizer.zero_grad(set_to_none=False)  # gradients stay allocated, as the estimate's total assumes
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    model(inputs, targets)[1].backward()  # [1]: the logits are not kept alive past the loss
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    total = estimate(memory, cfg, batch)["total"]
    record("estimated total", total, unit="B")
    record("max_memory_allocated", peak, unit="B")
    if abs(total - peak) > ACTIVATION_RTOL * peak:
        raise LabCheckFailed(f"estimated total {total / 2**20:.1f} MiB, measured peak {peak / 2**20:.1f} MiB "
                             f"({abs(total - peak) / peak:.0%} off, allowed {ACTIVATION_RTOL:.0%}) for {cfg}, batch "
                             f"{batch}, fp32 AdamW on the GPU")
