"""Int8 weight-only quantisation with one scale per output channel.

    quantize(weight)          (out, in) float -> (q int8 (out, in), scale fp32 (out,)), weight ~= q * scale[:, None]
    dequantize(q, scale)      -> the fp32 weight q * scale[:, None]
    quantize_model(model)     a copy of the kit GPT whose block Linears (attn.qkv, attn.proj, mlp.up, mlp.down)
                              store int8 weights and fp32 scales, and compute with the dequantised weight
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # TODO: symmetric per-channel int8. Every element's error |w - q * scale| must stay within scale / 2,
    # each row's scale must come from that row alone, and an all-zero row must not give NaN.
    raise NotImplementedError("quantize: one scale per output channel, round to the nearest step, clamp, int8")


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


class Int8Linear(nn.Module):
    """A bias-free Linear whose weight is stored as int8 + one fp32 scale per output channel; the matmul runs on
    the dequantised weight (weight-only quantisation)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        # TODO: quantize linear.weight and keep q and scale so that they are part of state_dict; keep no fp32 copy
        raise NotImplementedError("Int8Linear: store the int8 weight and its scales")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Int8Linear.forward: x times the dequantised weight, transposed")


def quantize_model(model: nn.Module) -> nn.Module:
    qmodel = copy.deepcopy(model)
    for block in qmodel.blocks:
        for parent, name in ((block.attn, "qkv"), (block.attn, "proj"), (block.mlp, "up"), (block.mlp, "down")):
            setattr(parent, name, Int8Linear(getattr(parent, name)))
    return qmodel
