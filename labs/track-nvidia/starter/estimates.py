"""Estimates made before measuring: the FLOPs of one training step of the course GPT."""


def model_flops_per_step(config: dict, tokens: int) -> int:
    """FLOPs of one training step (forward + backward) over `tokens` tokens; `config` holds a GPTConfig's fields
    (vocab_size, seq_len, d_model, n_head, n_layer, mlp_ratio, n_kv_head)."""
    # TODO: count the matmuls per token (2 FLOPs per weight: qkv, proj, up, down per layer, the tied head), add
    # attention's QK^T and AV, and multiply the forward by 3 for forward + backward.
    raise NotImplementedError("write model_flops_per_step in estimates.py: matmul weights x 2 per token, attention's "
                              "QK^T and AV, and x3 for the backward")
