"""Device memory of the port, estimated before anything runs: weights, KV cache, and the layer outputs of one
forward pass, for a model config (the keys of reference.CONFIG), a batch, and bytes per element."""
from __future__ import annotations


def weight_bytes(vocab_size, seq_len, d_model, n_head, n_layer, mlp_ratio, n_kv_head, dtype_bytes) -> int:
    kv_dim = d_model // n_head * (n_kv_head or n_head)
    per_block = (2 * d_model                        # two RMSNorm weights
                 + d_model * (d_model + 2 * kv_dim)  # qkv
                 + d_model * d_model                 # proj
                 + 2 * mlp_ratio * d_model * d_model)  # up and down
    # the head shares the token embedding's matrix: counted once
    return dtype_bytes * (vocab_size * d_model + seq_len * d_model + n_layer * per_block + d_model)


def kv_cache_bytes(vocab_size, seq_len, d_model, n_head, n_layer, mlp_ratio, n_kv_head, batch, dtype_bytes) -> int:
    kv_dim = d_model // n_head * (n_kv_head or n_head)
    return dtype_bytes * 2 * n_layer * batch * seq_len * kv_dim


def activation_bytes(vocab_size, seq_len, d_model, n_head, n_layer, mlp_ratio, n_kv_head, batch,
                     dtype_bytes) -> int:
    """Every layer's output of one forward pass at seq_len tokens (what the per-layer comparison holds)."""
    tokens = batch * seq_len
    kv_dim = d_model // n_head * (n_kv_head or n_head)
    per_block = tokens * (d_model + (d_model + 2 * kv_dim) + d_model + d_model + mlp_ratio * d_model + d_model)
    embeddings = tokens * d_model + seq_len * d_model  # positions are not batched: (T, C)
    return dtype_bytes * (embeddings + n_layer * per_block + tokens * d_model + tokens * vocab_size)
