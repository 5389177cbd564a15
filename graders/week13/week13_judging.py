"""The judge's per-device memory of ZeRO / FSDP training (week 13's memory_model.py is graded against it).

Judge side only: the graders' folder is never mounted in the sandbox, so a memory_model.py cannot import this
formula and hand back its answers instead of computing its own (in kit.sharding, which the ranks need, it could).
The convention it follows is the handout's and kit.sharding's docstring: P parameters, N devices, stage 0-3, a
sharded quantity padded to N * ceil(P / N).
"""
from __future__ import annotations

from infracourse.kit.sharding import PRECISIONS, STAGES


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
