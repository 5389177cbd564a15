"""Week 4, part 3: one Transformer block's parts written from tensor ops, and the layout at each stage.

Parameter names match infracourse.kit.gpt so the grader can load the kit's weights into these modules.
"""
import math

import torch
import torch.nn as nn

from rmsnorm_function import rms_norm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # TODO(week04): use your rms_norm; the kit computes in fp32 whatever the input dtype.
        raise NotImplementedError("RMSNorm.forward: normalise x with your rms_norm")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        # TODO(week04): q, k, v per head; scaled scores; causal mask; softmax; weighted sum; heads merged;
        # proj. No F.scaled_dot_product_attention.
        raise NotImplementedError("CausalSelfAttention.forward: write attention from matmul and softmax")


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        # TODO(week04): up, exact GELU written with torch.erf (no F.gelu), down.
        raise NotImplementedError("MLP.forward: up, GELU from erf, down")


def layouts(batch: int, seq: int, cfg) -> dict:
    """(shape, stride) of each stage of a kit Block for a (batch, seq, d_model) input."""
    # TODO(week04): stages "x", "qkv", "q", "k_t", "scores", "merged", "hidden" (see README.md).
    raise NotImplementedError("layouts(): write down the shape and strides of every stage")
