"""Per-device bytes of training state under data parallelism and ZeRO stages 1-3 (the handout's convention)."""
from __future__ import annotations

# bytes per element of (parameters, gradients, optimiser states)
BYTES = {
    "fp32": (4, 4, 8),         # AdamW: exp_avg + exp_avg_sq, fp32
    "bf16-mixed": (2, 2, 12),  # bf16 weights and grads; fp32 master weights + exp_avg + exp_avg_sq
}


def memory_per_device(params: int, world: int, stage: int, precision: str) -> dict[str, int]:
    """Bytes on each of `world` devices for `params` parameters at ZeRO `stage` (0 = plain DP)."""
    if precision not in BYTES or stage not in (0, 1, 2, 3) or world < 1:
        raise ValueError(f"unknown configuration: world={world}, stage={stage}, precision={precision!r}")
    p_bytes, g_bytes, o_bytes = BYTES[precision]
    shard = (params + world - 1) // world  # a padded flat buffer: every device holds ceil(P / N)
    result = {
        "params": p_bytes * (shard if stage >= 3 else params),
        "grads": g_bytes * (shard if stage >= 2 else params),
        "optimizer": o_bytes * (shard if stage >= 1 else params),
    }
    result["total"] = sum(result.values())
    return result


def largest_model_that_fits(memory_bytes: int, world: int, stage: int, precision: str) -> int:
    """The largest parameter count whose per-device total is at most `memory_bytes`."""
    def fits(p: int) -> bool:
        return memory_per_device(p, world, stage, precision)["total"] <= memory_bytes

    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
