"""The precision harness: a device run against the reference, layer by layer."""
from __future__ import annotations

import torch


def compare(reference: dict[str, torch.Tensor], device: dict[str, torch.Tensor]) -> dict:
    """{"layers": [{"name", "max_abs", "max_rel", "cosine", "ok"}, ... in the reference's order],
    "first_divergent": the first layer that is not ok, or None}."""
    # TODO: per layer, in float64: max abs error, max relative error, cosine similarity; ok against a
    #       tolerance chosen by the device tensor's dtype
    raise NotImplementedError("write harness.compare: per-layer errors and verdicts against a dtype-aware "
                              "tolerance, and the first divergent layer (README: 'harness.py')")
