"""A Llama-style decoder served from a Hugging Face-layout checkpoint, in reading order: RoPE -> attention ->
SwiGLU MLP -> layer -> model -> KV cache -> generation (weeks 15-18).

Module and parameter names are HF's (model.layers.N.self_attn.q_proj ...), so a checkpoint's tensors load by
name. Device- and dtype-agnostic: the model runs where its tensors are (CPU or CUDA), in their dtype.

    model = Llama.from_checkpoint("ckpt", device="cuda", dtype=torch.bfloat16)
    cache = model.new_cache(batch=4, max_len=512)         # contiguous K/V per layer: (B, kv_heads, max_len, hd)
    logits = model(prompt_ids, cache)                     # prefill: (B, T) -> (B, T, vocab), cache.length = T
    logits = model(next_ids, cache)                       # decode: (B, 1), attends to everything cached
    tokens = generate(model, prompt_ids, new_tokens=16)   # greedy, prefill once then one decode step per token

Without a cache `model(ids)` is the plain causal forward over the whole sequence.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from infracourse.kit.gpt import RMSNorm
from infracourse.kit.hf_checkpoint import LlamaConfig, load_checkpoint


def rope_tables(cfg: LlamaConfig, positions: torch.Tensor, dtype: torch.dtype):
    """cos, sin of shape (T, head_dim) for `positions` (T,): HF's layout, frequencies repeated in two halves."""
    hd = cfg.dim_per_head
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, device=positions.device, dtype=torch.float32) / hd)
    angles = positions.float()[:, None] * inv_freq[None, :]          # (T, hd/2), in fp32: positions reach 1e5
    angles = torch.cat((angles, angles), dim=-1)                     # (T, hd)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, heads, T, hd) by position: pairs (i, i + hd/2) turn by the angle of frequency i (rotate_half)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Contiguous keys and values of every layer for a batch of B sequences of equal length, preallocated to
    max_len: k[i], v[i] are (B, kv_heads, max_len, head_dim); positions < `length` are filled."""

    def __init__(self, cfg: LlamaConfig, batch: int, max_len: int, *, device, dtype: torch.dtype):
        if max_len > cfg.max_positions:
            raise ValueError(f"max_len {max_len} exceeds the model's max_position_embeddings {cfg.max_positions}")
        shape = (batch, cfg.kv_heads, max_len, cfg.dim_per_head)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.max_len = max_len
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store T new keys/values (B, kv_heads, T, hd) of `layer` after `length`; returns everything cached
        for that layer, (B, kv_heads, length + T, hd). `length` moves on once the last layer has stored."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} tokens; {end} asked (allocate a longer cache)")
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        if layer == len(self.k) - 1:
            self.length = end
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    @property
    def nbytes(self) -> int:
        """Bytes the cache's tensors hold (allocated: max_len tokens per sequence)."""
        return sum(t.nbytes for t in (*self.k, *self.v))


class Attention(nn.Module):
    """Grouped-query attention: `heads` query heads share `kv_heads` key/value heads, heads // kv_heads each."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.dim_per_head
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=cfg.o_bias)

    def forward(self, x, cos, sin, cache: KVCache | None, layer: int):
        B, T, _ = x.shape
        hd = self.cfg.dim_per_head
        q = self.q_proj(x).view(B, T, self.cfg.heads, hd).transpose(1, 2)      # (B, heads, T, hd)
        k = self.k_proj(x).view(B, T, self.cfg.kv_heads, hd).transpose(1, 2)   # (B, kv_heads, T, hd)
        v = self.v_proj(x).view(B, T, self.cfg.kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.append(layer, k, v)                                    # (B, kv_heads, S, hd)
        S = k.shape[2]
        # the T queries are the last T of S positions: query i sees keys 0 .. S - T + i
        mask = None if T == 1 else torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, heads, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.cfg.heads * hd))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, eps=cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, eps=cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, layer):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, eps=cfg.rms_eps)


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def from_tensors(cls, cfg: LlamaConfig, tensors: dict[str, torch.Tensor]) -> "Llama":
        """The model holding `tensors` (HF names) themselves, no copy: built on the meta device, then assigned."""
        with torch.device("meta"):
            model = cls(cfg)
        if cfg.tie_embeddings:
            tensors = {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]}
        model.load_state_dict(tensors, strict=True, assign=True)
        if cfg.tie_embeddings:  # assign made two Parameters of one tensor: one Parameter again, as built
            model.lm_head.weight = model.model.embed_tokens.weight
        return model.eval()

    @classmethod
    def from_checkpoint(cls, folder, *, device="cpu", dtype: torch.dtype | None = None) -> "Llama":
        cfg, tensors = load_checkpoint(folder, device=device, dtype=dtype)
        return cls.from_tensors(cfg, tensors)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(self.cfg, batch, max_len, device=self.device, dtype=self.dtype)

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """(B, T) token ids at positions cache.length .. + T - 1 (0 .. T - 1 without a cache) -> (B, T, vocab)."""
        start = cache.length if cache is not None else 0
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        if positions[-1] >= self.cfg.max_positions:
            raise ValueError(f"position {int(positions[-1])} is past max_position_embeddings {self.cfg.max_positions}")
        cos, sin = rope_tables(self.cfg, positions, self.dtype)
        x = self.model.embed_tokens(ids)                                  # (B, T, C)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, cache, i)
        return self.lm_head(self.model.norm(x))


@torch.no_grad()
def generate(model: Llama, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of (B, T) prompts: one prefill, then one cached decode step per further token.
    Returns (B, new_tokens) ids."""
    cache = model.new_cache(prompt.shape[0], prompt.shape[1] + new_tokens)
    nxt = model(prompt, cache)[:, -1].argmax(-1, keepdim=True)           # (B, 1) after the prefill
    out = [nxt]
    for _ in range(new_tokens - 1):                                      # the last token is never fed back
        nxt = model(nxt, cache)[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
    return torch.cat(out, dim=1)
