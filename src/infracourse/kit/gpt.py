"""The course's tiny GPT, in reading order: norm -> attention -> MLP -> block -> config -> model.

Weights come from a seeded generator; nothing is downloaded. Labs take it apart (week 4), train and
resume it (week 5), account for its memory (week 6) and swap in their own fused norm (week 10), which
is why the normalisation is a constructor argument.

Serving API (weeks 15-18): a config may group its key/value heads (`n_kv_head` < `n_head`, grouped-query
attention; None means one KV head per query head, the weeks 4-6 model, same weights for the same seed). The
model is taken apart for incremental decoding with these pieces; a cache is written by the lab, not here:

    x = model.embed(ids, pos_offset)                 # (B, T, C): token + position embeddings, positions
                                                     #   pos_offset .. pos_offset + T - 1 (< cfg.seq_len)
    for block in model.blocks:
        q, k, v = block.attn.qkv_heads(block.norm1(x))   # q (B, n_head, T, hd); k, v (B, kv_heads, T, hd)
        ... store k, v; K, V = all cached keys/values of this layer, (B, kv_heads, S, hd), S = offset + T
        x = x + block.attn.attend(q, K, V)           # queries are the LAST T positions of the S keys (causal)
        x = x + block.mlp(block.norm2(x))
    logits = model.logits(x)                         # (B, T, vocab)

`model(idx)` is exactly this with S = T and pos_offset 0. `attend(q, K, V, key_mask=...)` takes an optional
(B, S) bool mask of valid keys (False = padding) for batches of prompts of different lengths.
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
    """Causal self-attention; `n_kv_head` < `n_head` shares each key/value head among n_head // n_kv_head
    query heads (grouped-query attention). Split into `qkv_heads` and `attend` so a KV cache fits between."""

    def __init__(self, cfg: "GPTConfig"):
        super().__init__()
        self.n_head = cfg.n_head
        self.n_kv_head = cfg.kv_heads
        self.head_dim = cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, cfg.d_model + 2 * self.n_kv_head * self.head_dim, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def qkv_heads(self, x: torch.Tensor):
        """(B, T, C) -> q (B, n_head, T, head_dim), k and v (B, n_kv_head, T, head_dim)."""
        B, T, C = x.shape
        kv = self.n_kv_head * self.head_dim
        # an even split when there is no grouping: the same aten op as the weeks 4-6 model (week 6's traces)
        q, k, v = self.qkv(x).split(C, dim=2) if kv == C else self.qkv(x).split((C, kv, kv), dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k, v = (t.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2) for t in (k, v))
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, n_head, T, hd) are the last T of the S positions of k, v (B, n_kv_head, S, hd): query i sees
        keys 0 .. S - T + i. key_mask (B, S) bool, False for padding keys. Returns the projected (B, T, C)."""
        B, H, T, hd = q.shape
        S = k.shape[2]
        if self.n_kv_head != self.n_head:
            group = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if S == T and key_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)  # (T, S)
            if key_mask is not None:
                mask = mask & key_mask[:, None, None, :].to(torch.bool)  # (B, 1, T, S)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, H * hd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(*self.qkv_heads(x))


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
    n_kv_head: int | None = None  # None: n_head (no grouping); must divide n_head

    def __post_init__(self):
        if self.d_model % self.n_head or self.n_head % self.kv_heads:
            raise ValueError(f"GPTConfig: d_model {self.d_model} must divide into n_head {self.n_head} heads and "
                             f"n_head into n_kv_head {self.kv_heads} groups")

    @property
    def kv_heads(self) -> int:
        """Key/value heads per layer: n_kv_head, or n_head when it is None."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


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

    def embed(self, idx: torch.Tensor, pos_offset: int = 0) -> torch.Tensor:
        """(B, T) token ids at positions pos_offset .. pos_offset + T - 1 -> (B, T, C)."""
        T = idx.shape[1]
        if pos_offset + T > self.cfg.seq_len:
            raise ValueError(f"positions up to {pos_offset + T - 1} asked of a model with seq_len {self.cfg.seq_len}")
        pos = torch.arange(pos_offset, pos_offset + T, device=idx.device)
        return self.tok_emb(idx) + self.pos_emb(pos)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) hidden states after the last block -> (B, T, vocab) logits."""
        return self.head(self.norm(x))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.embed(idx)  # (B, T, C) from (B, T) token ids
        for block in self.blocks:
            x = block(x)
        logits = self.logits(x)  # (B, T, vocab)
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def synthetic_batch(cfg: GPTConfig, batch_size: int, *, seed: int, device: str = "cpu"):
    """A deterministic (inputs, targets) pair of token ids: targets are inputs shifted by one."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(cfg.vocab_size, (batch_size, cfg.seq_len + 1), generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)
