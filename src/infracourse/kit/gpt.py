"""The course's tiny GPT, in reading order: norm -> attention -> MLP -> block -> config -> model.

Weights come from a seeded generator; nothing is downloaded. Labs take it apart (week 4), train and
resume it (week 5), account for its memory (week 6) and swap in their own fused norm (week 10), which
is why the normalisation is a constructor argument.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight. `norm_fn` lets a lab replace the arithmetic with a kernel."""

    def __init__(self, dim: int, eps: float = 1e-6, norm_fn: Callable | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.norm_fn = norm_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_fn is not None:
            return self.norm_fn(x, self.weight, self.eps)
        # computed in fp32 whatever the activation dtype: squares of bf16 values lose too much
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: "GPTConfig"):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # each (B, T, C)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, n_head, T, head_dim)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: "GPTConfig"):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: "GPTConfig", norm_fn: Callable | None = None):
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model, norm_fn=norm_fn)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = RMSNorm(cfg.d_model, norm_fn=norm_fn)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    seq_len: int = 64
    d_model: int = 64
    n_head: int = 4
    n_layer: int = 2
    mlp_ratio: int = 4


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig = GPTConfig(), *, seed: int = 0, norm_fn: Callable | None = None):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, norm_fn) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, norm_fn=norm_fn)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied: one matrix for embedding and output
        self._init_weights(seed)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        # a private generator: the model's weights never depend on, or disturb, the global RNG
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
                continue  # norms start at 1
            std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith(("proj.weight", "down.weight")) else 0.02
            p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape  # (B, T) token ids
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))  # (B, T, vocab)
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def synthetic_batch(cfg: GPTConfig, batch_size: int, *, seed: int, device: str = "cpu"):
    """A deterministic (inputs, targets) pair of token ids: targets are inputs shifted by one."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(cfg.vocab_size, (batch_size, cfg.seq_len + 1), generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)
