"""Week 6, part 1: the bytes a training step of the kit GPT needs, estimated before running anything.

Training with AdamW keeps four things in memory: the parameters, one gradient per parameter, the
optimiser's state, and the activations the forward pass saves for the backward pass.
"""
from infracourse.kit.gpt import GPTConfig

BYTES = {"fp32": 4, "bf16": 2}


def parameter_count(cfg: GPTConfig) -> int:
    C, F = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    per_block = 2 * C + 4 * C * C + 2 * C * F  # two norm weights; qkv + proj; up + down (no biases)
    # the output head is tied to the token embedding: one matrix, counted once
    return cfg.vocab_size * C + cfg.seq_len * C + cfg.n_layer * per_block + C


def activation_bytes(cfg: GPTConfig, batch: int, e: int) -> int:
    """Bytes autograd saves for backward, for activations of e bytes per element."""
    B, T, C, H, V = batch, cfg.seq_len, cfg.d_model, cfg.n_head, cfg.vocab_size
    F = cfg.mlp_ratio * C
    # RMSNorm computes in fp32 whatever the dtype: it saves its input upcast to fp32, the fp32 1/rms per row,
    # and the normalised x (e); the linear layer after it saves the norm's output (e)
    norm = 4 * B * T * C + 4 * B * T + 2 * e * B * T * C
    attention = 3 * e * B * T * C + e * B * T * C + 4 * B * H * T  # qkv (q, k, v are views of it), output, logsumexp
    mlp = 2 * e * B * T * F  # GELU saves its input, the down projection saves GELU's output
    block = 2 * norm + attention + mlp
    head = norm + e * B * T * V  # cross-entropy saves the log-softmax output, not the logits
    token_ids = 8 * (2 * B * T + T)  # inputs, flattened targets, positions (int64)
    return cfg.n_layer * block + head + token_ids


def estimate_memory(cfg: GPTConfig, batch_size: int, precision: str = "fp32", master_weights: bool = False) -> dict:
    """Bytes of params, grads, optimizer state and activations of one AdamW training step, and their total."""
    e = BYTES[precision]
    n = parameter_count(cfg)
    # Adam keeps two moments (exp_avg, exp_avg_sq) like the weights it updates; with master weights those
    # are an fp32 copy of every parameter, which the optimiser holds too: 4 + 4 + 4 bytes per parameter
    optimizer = 3 * 4 * n if master_weights else 2 * e * n
    parts = {"params": e * n, "grads": e * n, "optimizer": optimizer,
             "activations": activation_bytes(cfg, batch_size, e)}
    return parts | {"total": sum(parts.values())}
