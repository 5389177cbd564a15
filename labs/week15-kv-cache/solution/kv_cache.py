"""Week 15: greedy generation with a KV cache, on the kit's GPT (infracourse.kit.gpt).

prefill: the whole prompt goes through the model once; every layer's keys and values are stored.
decode:  each new token goes through alone, at position offset = tokens already cached, and attends to the
         cached keys and values plus its own.
The cache here is preallocated: one (batch, kv_heads, capacity, head_dim) buffer per layer for K and one for V,
filled in place, so decoding allocates nothing new per token. A batch is B prompts of one length, decoded in
step: every matrix product then reads the weights once for B tokens (what makes a batch cheaper per token).
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, cfg, capacity: int, dtype: torch.dtype, device, batch: int = 1):
        shape = (batch, cfg.kv_heads, capacity, cfg.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.n_layer)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.n_layer)]
        self.length = 0  # tokens cached so far (the position of the next token)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, kv_heads, T, head_dim) after the cached tokens; return all keys and values so far."""
        end = self.length + k.shape[2]
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def tensors(self) -> list[torch.Tensor]:
        """K and V of every layer holding exactly the cached tokens: (B, kv_heads, length, head_dim) each."""
        return [t[:, :, :self.length] for pair in zip(self.k, self.v) for t in pair]


@torch.no_grad()
def forward(model, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run ids (B, T) at positions cache.length .. cache.length + T - 1; return the last position's logits (B,
    vocab)."""
    x = model.embed(ids, cache.length)
    for layer, block in enumerate(model.blocks):
        q, k, v = block.attn.qkv_heads(block.norm1(x))
        keys, values = cache.append(layer, k, v)
        x = x + block.attn.attend(q, keys, values)
        x = x + block.mlp(block.norm2(x))
    cache.length += ids.shape[1]
    return model.logits(x[:, -1:])[:, -1]


def generate(model, prompt_ids, max_new_tokens: int):
    """Greedy: returns (new tokens, their logits (max_new_tokens, vocab) in fp32, the cache). A batch (a list of
    B equal-length prompts) returns B lists of tokens and (B, max_new_tokens, vocab) logits."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    batched = bool(prompt_ids) and isinstance(prompt_ids[0], (list, tuple))
    ids = torch.tensor([list(p) for p in prompt_ids] if batched else [list(prompt_ids)], dtype=torch.long,
                       device=device)
    cache = KVCache(model.cfg, ids.shape[1] + max_new_tokens, dtype, device, batch=ids.shape[0])
    logits = forward(model, ids, cache)  # prefill
    steps, all_logits = [], []
    for step in range(max_new_tokens):
        nxt = logits.float().argmax(-1)  # (B,): one host sync per step, all sequences at once
        steps.append(nxt.tolist())
        all_logits.append(logits.float())
        if step + 1 < max_new_tokens:  # the last token is returned, never fed back
            logits = forward(model, nxt[:, None], cache)  # decode
    tokens = [list(seq) for seq in zip(*steps)]  # (B, max_new_tokens) as lists
    if not batched:
        return tokens[0], torch.stack(all_logits)[:, 0], cache
    return tokens, torch.stack(all_logits, dim=1), cache


def kv_bytes(config, tokens: int, dtype: torch.dtype) -> int:
    """K and V, every layer, every KV head: 2 x layers x kv_heads x head_dim x tokens x bytes per element."""
    bytes_per_element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layer * config.kv_heads * config.head_dim * tokens * bytes_per_element
