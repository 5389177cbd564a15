"""Week 15: greedy generation with a KV cache, on the kit's GPT (infracourse.kit.gpt).

prefill: run the whole prompt through the model once, storing every layer's keys and values.
decode:  run each new token alone, at position offset = tokens already cached, attending to the cached keys
         and values plus its own.
Read the docstring at the top of infracourse/kit/gpt.py: it shows the pieces (embed, qkv_heads, attend, logits).
"""
from __future__ import annotations

import torch


class KVCache:
    """Keys and values of every layer for the tokens processed so far (batch 1)."""

    def __init__(self, cfg, capacity: int, dtype: torch.dtype, device):
        # TODO: whatever you need to hold K and V (1, cfg.kv_heads, tokens, cfg.head_dim) for cfg.n_layer layers
        self.length = 0  # tokens cached so far

    def tensors(self) -> list[torch.Tensor]:
        """K and V of every layer (2 x n_layer tensors), each (1, kv_heads, cached tokens, head_dim): exactly the
        cached tokens (a view of a larger buffer is fine). The grader sums their bytes."""
        raise NotImplementedError("KVCache.tensors: return the K and V tensors of every layer")


def generate(model, prompt_ids: list[int], max_new_tokens: int):
    """Greedy generation with the cache: prefill the prompt, then decode one token at a time.

    Returns (tokens: list of max_new_tokens ints, logits: (max_new_tokens, vocab) tensor, the logits each token
    was the argmax of, cache: your KVCache after the last step).

    A batch: prompt_ids a list of B prompts of one length decodes them in step (the cache holds B rows) and
    returns B lists of tokens and (B, max_new_tokens, vocab) logits."""
    raise NotImplementedError("generate: prefill the prompt into a KVCache, then decode token by token")


def kv_bytes(config, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of K and V for `tokens` cached tokens of a model with this GPTConfig, elements of `dtype`."""
    raise NotImplementedError("kv_bytes: the cache's size from the configuration's numbers")
