"""Per-device bytes of training state under data parallelism and ZeRO stages 1-3 (the handout's convention)."""
from __future__ import annotations


def memory_per_device(params: int, world: int, stage: int, precision: str) -> dict[str, int]:
    """Bytes on each of `world` devices for `params` parameters at ZeRO `stage` (0 = plain DP), precision
    "fp32" or "bf16-mixed": {"params": ..., "grads": ..., "optimizer": ..., "total": ...}."""
    raise NotImplementedError("TODO: the bytes per element from the handout's table, ceil(P / N) where sharded")


def largest_model_that_fits(memory_bytes: int, world: int, stage: int, precision: str) -> int:
    """The largest parameter count whose per-device total is at most `memory_bytes`."""
    raise NotImplementedError("TODO: search over P with memory_per_device")
