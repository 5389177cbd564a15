"""The judge's references of week 13: the per-device memory of ZeRO / FSDP training (memory_model.py is graded
against it), the unsharded AdamW run the sharded ones must equal and the plain forward checkpointing must match.

Judge side only: the graders' folder is never mounted in the sandbox, so a learner's file cannot import these and
hand back their answers instead of computing its own (in kit.sharding, which the ranks need, it could: a
Zero1AdamW that copied the unsharded run into its parameters every step passed both ZeRO-1 checks).
The memory convention is the handout's and kit.sharding's docstring: P parameters, N devices, stage 0-3, a
sharded quantity padded to N * ceil(P / N).
"""
from __future__ import annotations

import torch

from infracourse.kit.sharding import (BETAS, EPS, LR, PRECISIONS, STAGES, WEIGHT_DECAY, checkpoint_inputs,
                                      flat_params, global_batch, loss_fn, make_model, saved_bytes)


def zero_reference(seed: int, world: int, steps: int) -> torch.Tensor:
    """The unsharded run every configuration must equal: torch.optim.AdamW on the global batch's mean loss."""
    model = make_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    for step in range(steps):
        x, y = global_batch(seed, step, world)
        loss_fn(model, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return flat_params(model)


def checkpoint_reference(seed: int) -> dict:
    """The plain forward's saved bytes, output and gradients, which checkpointed_forward must equal."""
    model, x = checkpoint_inputs(seed)
    nbytes, out, grads = saved_bytes(lambda m, t: m(t), model, x)
    return {"bytes": nbytes, "out": out, "grads": grads}


def memory_per_device(params: int, world: int, stage: int, precision: str) -> dict[str, int]:
    """Bytes each device holds for parameters, gradients and optimiser states."""
    if precision not in PRECISIONS or stage not in STAGES or world < 1 or params < 0:
        raise ValueError(f"no memory model for params={params}, world={world}, stage={stage}, {precision!r}")
    p_bytes, g_bytes, o_bytes = PRECISIONS[precision]
    shard = -(-params // world)
    out = {"params": (shard if stage >= 3 else params) * p_bytes,
           "grads": (shard if stage >= 2 else params) * g_bytes,
           "optimizer": (shard if stage >= 1 else params) * o_bytes}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def largest_model_that_fits(memory_bytes: int, world: int, stage: int, precision: str) -> int:
    """The largest parameter count whose total per-device bytes are at most `memory_bytes` (0 if none)."""
    lo, hi = 0, 1
    while memory_per_device(hi, world, stage, precision)["total"] <= memory_bytes:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # total(lo) fits, total(hi) does not; total never decreases as params grows
        mid = (lo + hi) // 2
        if memory_per_device(mid, world, stage, precision)["total"] <= memory_bytes:
            lo = mid
        else:
            hi = mid
    return lo
