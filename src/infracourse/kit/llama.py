"""A Llama-style decoder served from a Hugging Face-layout checkpoint, in reading order: RoPE -> KV cache ->
attention -> SwiGLU MLP -> layer -> model -> generation (weeks 15-18).

Module and parameter names are HF's (model.layers.N.self_attn.q_proj ...), so a checkpoint's tensors load by
name. Device- and dtype-agnostic: the model runs where its tensors are (CPU or CUDA), in their dtype.

    model = Llama.from_checkpoint("ckpt", device="cuda", dtype=torch.bfloat16)
    cache = model.new_cache(batch=4, max_len=512)         # contiguous K/V per layer: (B, kv_heads, max_len, hd)
    logits = model(prompt_ids, cache)                     # prefill: (B, T) -> (B, T, vocab), cache.length = T
    logits = model(next_ids, cache)                       # decode: (B, 1), attends to everything cached
    tokens = generate(model, prompt_ids, new_tokens=16)   # greedy, prefill once then one decode step per token

The model comes apart with the same pieces as kit.gpt's, so a cache written for that model serves this one:

    x = model.embed(ids, pos_offset)                      # (B, T, C); positions enter through RoPE, below
    for block in model.blocks:
        q, k, v = block.attn.qkv_heads(block.norm1(x))    # q (B, heads, T, hd); k, v (B, kv_heads, T, hd)
        ... store k, v; K, V = all cached keys/values of this layer, (B, kv_heads, S, hd)
        x = x + block.attn.attend(q, K, V)                # queries are the LAST T of the S positions (causal)
        x = x + block.mlp(block.norm2(x))
    logits = model.logits(x)                              # (B, T, vocab)

Keys are cached as projected, before RoPE: `attend` rotates the S keys at positions 0 .. S - 1 and the queries
at S - T .. S - 1, the positions the cache implies. vLLM and HF cache rotated keys instead; the values are the
same (the same rotation of the same numbers), the cost is one extra elementwise pass over K per step.
Without a cache `model(ids)` is the plain causal forward over the whole sequence.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from infracourse.kit.gpt import RMSNorm
from infracourse.kit.hf_checkpoint import LlamaConfig, load_checkpoint, make_and_describe


def rope_frequencies(cfg: LlamaConfig, device=None) -> torch.Tensor:
    """The head_dim / 2 rotation frequencies theta^(-2i / head_dim), with Llama 3.x's long-context scaling when
    the config has it: wavelengths shorter than original / high_freq_factor keep their frequency, longer than
    original / low_freq_factor are slowed by `factor`, and those between are blended smoothly."""
    hd = cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd)
    if cfg.rope_llama3 is None:
        return inv_freq
    factor, low, high, original = cfg.rope_llama3
    wavelen = 2 * math.pi / inv_freq
    blend = ((original / wavelen - low) / (high - low)).clamp(0, 1)       # 0: long wavelengths, 1: short ones
    return (1 - blend) * inv_freq / factor + blend * inv_freq


def rope_tables(cfg: LlamaConfig, positions: torch.Tensor, dtype: torch.dtype):
    """cos, sin of shape (T, head_dim) for `positions` (T,): HF's layout, frequencies repeated in two halves."""
    inv_freq = rope_frequencies(cfg, positions.device)
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
        shape = (batch, cfg.kv_heads, max_len, cfg.head_dim)
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
    """Grouped-query attention: `heads` query heads share `kv_heads` key/value heads, heads // kv_heads each.
    Split into `qkv_heads` and `attend` so a KV cache fits between (the kit.gpt contract)."""

    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * hd, bias=cfg.qkv_bias, device=device)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=cfg.qkv_bias, device=device)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=cfg.qkv_bias, device=device)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=cfg.o_bias, device=device)

    def qkv_heads(self, x: torch.Tensor):
        """(B, T, C) -> q (B, heads, T, hd), k and v (B, kv_heads, T, hd), before RoPE."""
        B, T, _ = x.shape
        hd = self.cfg.head_dim
        q = self.q_proj(x).view(B, T, self.cfg.heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.cfg.kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.cfg.kv_heads, hd).transpose(1, 2)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, heads, T, hd) are the last T of the S positions of k, v (B, kv_heads, S, hd): query i sees keys
        0 .. S - T + i. key_mask (B, S) bool, False for padding keys. Returns the projected (B, T, C)."""
        B, H, T, hd = q.shape
        S = k.shape[2]
        cos, sin = rope_tables(self.cfg, torch.arange(S, device=q.device), q.dtype)   # (S, hd)
        q, k = apply_rope(q, cos[S - T:], sin[S - T:]), apply_rope(k, cos, sin)
        mask = None if T == 1 else torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
        if key_mask is not None:
            key_mask = key_mask[:, None, None, :].to(torch.bool)                       # (B, 1, 1, S)
            mask = key_mask if mask is None else mask & key_mask
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, heads, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * hd))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False, device=device)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False, device=device)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False, device=device)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual layer: x + attn(norm1(x)), then x + mlp(norm2(x)); norm1, attn, norm2 are kit.gpt's
    names for HF's input_layernorm, self_attn, post_attention_layernorm."""

    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, eps=cfg.rms_eps)
        self.self_attn = Attention(cfg, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, eps=cfg.rms_eps)
        self.mlp = MLP(cfg, device)

    norm1 = property(lambda self: self.input_layernorm)
    attn = property(lambda self: self.self_attn)
    norm2 = property(lambda self: self.post_attention_layernorm)


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        # given a weight, Embedding skips its init (normal_, which on "meta" runs through torch._refs)
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden, device=device, _weight=None if device is None else
                                         torch.empty((cfg.vocab, cfg.hidden), device=device))
        self.layers = nn.ModuleList(DecoderLayer(cfg, device) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, eps=cfg.rms_eps)


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig, device=None):
        """`device` holds the projections and embeddings (the norms' few weights are made on the host): "meta"
        builds the shapes only, for tensors assigned afterwards (from_tensors)."""
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg, device)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, device=device)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def from_tensors(cls, cfg: LlamaConfig, tensors: dict[str, torch.Tensor]) -> "Llama":
        """The model holding `tensors` (HF names) themselves, no copy: built on the meta device, then assigned.
        (Built with device="meta" rather than under `with torch.device("meta")`, whose initialisation of meta
        tensors goes through torch._refs and imports the compiler stack: seconds per process.)"""
        model = cls(cfg, device="meta")
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

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.layers

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(self.cfg, batch, max_len, device=self.device, dtype=self.dtype)

    def embed(self, ids: torch.Tensor, pos_offset: int = 0) -> torch.Tensor:
        """(B, T) token ids at positions pos_offset .. + T - 1 -> (B, T, C). Token embeddings only: the
        positions act in attention (RoPE); the offset is checked against max_position_embeddings."""
        if pos_offset + ids.shape[1] > self.cfg.max_positions:
            raise ValueError(f"positions up to {pos_offset + ids.shape[1] - 1} asked of a model with "
                             f"max_position_embeddings {self.cfg.max_positions}")
        return self.model.embed_tokens(ids)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) hidden states after the last layer -> (B, T, vocab) logits."""
        return self.lm_head(self.model.norm(x))

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """(B, T) token ids at positions cache.length .. + T - 1 (0 .. T - 1 without a cache) -> (B, T, vocab)."""
        x = self.embed(ids, cache.length if cache is not None else 0)
        for i, block in enumerate(self.blocks):
            q, k, v = block.attn.qkv_heads(block.norm1(x))
            if cache is not None:
                k, v = cache.append(i, k, v)                              # (B, kv_heads, S, hd)
            x = x + block.attn.attend(q, k, v)
            x = x + block.mlp(block.norm2(x))
        return self.logits(x)


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


def checkpoint_model(sizes: dict, seed: int, dtype: str = "fp32", device: str = "cpu") -> Llama:
    """The model of a checkpoint written and read back as a served model is: LlamaConfig(**sizes) with seeded
    random weights saved to a fresh folder (config.json + safetensors), then loaded, checked, onto `device`."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="checkpoint-") as folder:
        make_and_describe(folder, sizes, dtype=dtype, seed=seed)
        return Llama.from_checkpoint(folder, device=device)
