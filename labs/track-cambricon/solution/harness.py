"""The precision harness: a device run against the reference, layer by layer.

For each layer: max abs error, max relative error, cosine similarity, and a verdict against the tolerance of
the device's dtype. The first layer that fails is where the port went wrong: in a chained run every later layer
inherits its error, so only the first one points at the cause.
"""
from __future__ import annotations

import torch

# error allowed, relative to the layer's largest reference value: a few units in the last place of the dtype
# (float32: eps 1.2e-7, and a different summation order costs a few of them; bfloat16: eps 7.8e-3)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def layer_report(name: str, reference: torch.Tensor, device: torch.Tensor) -> dict:
    ref, dev = reference.double().flatten(), device.double().flatten()
    diff = (dev - ref).abs()
    scale = ref.abs().max().item()
    max_abs = diff.max().item()
    cosine = torch.nn.functional.cosine_similarity(ref, dev, dim=0).item()
    return {"name": name, "dtype": str(device.dtype).removeprefix("torch."), "max_abs": max_abs,
            "max_rel": (diff / ref.abs().clamp_min(1e-6 * scale)).max().item(), "cosine": cosine,
            "ok": max_abs <= TOLERANCE[device.dtype] * scale}


def compare(reference: dict[str, torch.Tensor], device: dict[str, torch.Tensor]) -> dict:
    """{"layers": [per-layer report, in the reference's order], "first_divergent": name or None}."""
    missing = [name for name in reference if name not in device]
    if missing:
        raise ValueError(f"the device run lacks layers {missing}")
    layers = []
    for name, ref in reference.items():
        if device[name].shape != ref.shape:
            raise ValueError(f"{name}: device shape {tuple(device[name].shape)} != reference {tuple(ref.shape)}")
        layers.append(layer_report(name, ref, device[name]))
    first = next((layer["name"] for layer in layers if not layer["ok"]), None)
    return {"layers": layers, "first_divergent": first}
