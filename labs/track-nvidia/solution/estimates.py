"""Estimates made before measuring: the FLOPs of one training step of the course GPT."""


def model_flops_per_step(config: dict, tokens: int) -> int:
    """FLOPs of one training step (forward + backward) over `tokens` tokens; `config` holds a GPTConfig's fields.

    A matmul of an (m, k) by a (k, n) matrix is 2mkn FLOPs, so each weight costs 2 FLOPs per token forward;
    the backward computes two matmuls per forward one (gradients of the input and of the weight): 3x forward."""
    d, layers, seq = config["d_model"], config["n_layer"], config["seq_len"]
    kv_heads = config.get("n_kv_head") or config["n_head"]
    kv_width = kv_heads * (d // config["n_head"])
    qkv = d * (d + 2 * kv_width)
    proj = d * d
    mlp = 2 * config.get("mlp_ratio", 4) * d * d
    head = d * config["vocab_size"]  # tied with the embedding: counted once, as the output projection
    attention = 4 * seq * d  # per token and layer: QK^T and AV over seq_len keys (the causal mask not exploited)
    forward_per_token = 2 * (layers * (qkv + proj + mlp) + head) + layers * attention
    return 3 * forward_per_token * tokens
