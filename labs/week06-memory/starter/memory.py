"""Week 6, part 1: the bytes a training step of the kit GPT needs, estimated before running anything.

Training with AdamW keeps four things in memory: the parameters, one gradient per parameter, the
optimiser's state, and the activations the forward pass saves for the backward pass.
"""
from infracourse.kit.gpt import GPTConfig

BYTES = {"fp32": 4, "bf16": 2}


def estimate_memory(cfg: GPTConfig, batch_size: int, precision: str = "fp32", master_weights: bool = False) -> dict:
    """Bytes of params, grads, optimizer state and activations of one AdamW training step, and their total."""
    # TODO(week06): return {"params", "grads", "optimizer", "activations", "total"} as ints, from cfg alone.
    # precision is the dtype of weights, gradients and activations ("fp32" or "bf16"); master_weights means the
    # optimiser updates fp32 copies of the weights.
    raise NotImplementedError("estimate_memory(): count the bytes of each part (see the TODO in memory.py)")
