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
    w = weight.detach().float()
    # symmetric: the row's largest magnitude maps to 127, so round(w / scale) never leaves [-127, 127]
    scale = w.abs().amax(dim=1) / 127  # (out,)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row quantises to q = 0
    q = torch.round(w / safe[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


class Int8Linear(nn.Module):
    """A bias-free Linear whose weight is stored as int8 + one fp32 scale per output channel (buffers, so
    they are in state_dict and move with .to()); the matmul runs on the dequantised weight (weight-only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        q, scale = quantize(linear.weight)
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, dequantize(self.qweight, self.scale).to(x.dtype))


def quantize_model(model: nn.Module) -> nn.Module:
    qmodel = copy.deepcopy(model)
    for block in qmodel.blocks:
        for parent, name in ((block.attn, "qkv"), (block.attn, "proj"), (block.mlp, "up"), (block.mlp, "down")):
            setattr(parent, name, Int8Linear(getattr(parent, name)))
    return qmodel
