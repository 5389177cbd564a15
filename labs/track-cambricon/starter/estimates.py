"""Device memory of the port, estimated before anything runs: weights, KV cache, and the layer outputs of one
forward pass, for a model config (the keys of reference.CONFIG), a batch, and bytes per element."""
from __future__ import annotations


def weight_bytes(vocab_size, seq_len, d_model, n_head, n_layer, mlp_ratio, n_kv_head, dtype_bytes) -> int:
    # TODO: every parameter once (look at kit/gpt.py: which matrices are shared?)
    raise NotImplementedError("write estimates.weight_bytes (README: 'estimates.py')")


def kv_cache_bytes(vocab_size, seq_len, d_model, n_head, n_layer, mlp_ratio, n_kv_head, batch, dtype_bytes) -> int:
    # TODO: k and v of every layer at seq_len tokens (n_kv_head None means n_head)
    raise NotImplementedError("write estimates.kv_cache_bytes (README: 'estimates.py')")


def activation_bytes(vocab_size, seq_len, d_model, n_head, n_layer, mlp_ratio, n_kv_head, batch,
                     dtype_bytes) -> int:
    # TODO: every layer's output of one forward pass at seq_len tokens
    raise NotImplementedError("write estimates.activation_bytes (README: 'estimates.py')")
