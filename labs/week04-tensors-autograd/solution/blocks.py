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
        # computed in fp32 whatever the activation dtype: squares of bf16 values lose too much
        return rms_norm(x.float(), self.weight.float(), self.eps).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        head_dim = C // self.n_head
        # (B, T, 3C) -> three (B, T, C) slices -> (B, n_head, T, head_dim): views only, nothing is copied
        q, k, v = (t.view(B, T, self.n_head, head_dim).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)  # (B, n_head, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # True above the diagonal
        # softmax subtracts each row's max before exp, so large scores do not overflow
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        y = probs @ v  # (B, n_head, T, head_dim)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # heads side by side again: (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        h = self.up(x)
        return self.down(0.5 * h * (1 + torch.erf(h / math.sqrt(2))))  # exact GELU, as F.gelu computes it


def layouts(batch: int, seq: int, cfg) -> dict:
    """(shape, stride) of each stage of a kit Block for a (batch, seq, d_model) input."""
    B, T, C, H = batch, seq, cfg.d_model, cfg.n_head
    D, F = C // H, cfg.mlp_ratio * C
    return {
        "x": ((B, T, C), (T * C, C, 1)),
        "qkv": ((B, T, 3 * C), (T * 3 * C, 3 * C, 1)),
        # q is the first C columns of each qkv row, split into heads and transposed: only strides change
        "q": ((B, H, T, D), (T * 3 * C, D, 3 * C, 1)),
        "k_t": ((B, H, D, T), (T * 3 * C, D, 1, 3 * C)),
        "scores": ((B, H, T, T), (H * T * T, T * T, T, 1)),  # a matmul writes a fresh contiguous result
        "merged": ((B, T, C), (T * C, C, 1)),
        "hidden": ((B, T, F), (T * F, F, 1)),
    }
