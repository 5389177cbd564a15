"""Training pieces shared by weeks 5 and 6: a tiny config, a shuffled data stream, and the step week 6 fixes.

`Batches` draws from the three global random generators on purpose, as real input pipelines do: NumPy
shuffles each epoch, Python's `random` picks where each window starts, and torch corrupts a few input
tokens on the batch's device. A run that resumes exactly must therefore restore all three, and the
stream's own position (`state_dict`).
"""
from __future__ import annotations

import random

import numpy as np
import torch

from infracourse.kit.gpt import GPTConfig

# Small enough that a CPU step takes a few milliseconds, large enough to have every part of a GPT.
TRAIN_CONFIG = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_head=2, n_layer=2, mlp_ratio=4)
MAX_GRAD_NORM = 1.0


class Batches:
    """An endless stream of (inputs, targets) batches cut from a fixed synthetic corpus of documents."""

    def __init__(self, cfg: GPTConfig, batch_size: int, *, n_docs: int = 22, noise: float = 0.1, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)  # the corpus itself never touches the global generators
        self.docs = torch.randint(cfg.vocab_size, (n_docs, 2 * cfg.seq_len), generator=gen)
        self.cfg, self.batch_size, self.noise = cfg, batch_size, noise
        self.epoch, self.position, self.order = 0, 0, []

    def next(self, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        if self.position + self.batch_size > len(self.order):  # a new epoch: reshuffle, drop the remainder
            self.order = np.random.permutation(len(self.docs)).tolist()
            self.epoch, self.position = self.epoch + 1, 0
        ids = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        span = self.cfg.seq_len + 1
        starts = [random.randrange(self.docs.shape[1] - span + 1) for _ in ids]
        tokens = torch.stack([self.docs[i, s:s + span] for i, s in zip(ids, starts)]).to(device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        corrupt = torch.rand(inputs.shape, device=device) < self.noise
        inputs = torch.where(corrupt, torch.randint_like(inputs, self.cfg.vocab_size), inputs)
        return inputs, targets

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "order": list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self.order = state["epoch"], state["position"], list(state["order"])


def slow_train_step(model, optimizer, inputs, targets, metrics: dict) -> None:
    """The week-6 starting point: one correct training step that is slower than it needs to be.

    Profile it (torch.profiler, profile_memory=True) and find what it does that a step need not.
    `metrics` accumulates across steps: "loss_sum" (a float or a 0-d tensor) and "steps".
    """
    _, loss = model(inputs, targets)
    loss.backward()
    metrics["loss_sum"] = metrics.get("loss_sum", 0.0) + loss.item()
    metrics["steps"] = metrics.get("steps", 0) + 1
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total_norm = torch.cat([g.flatten() for g in grads]).norm()
    scale = (MAX_GRAD_NORM / (total_norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def mean_loss(metrics: dict) -> float:
    """The mean loss over the steps accumulated in `metrics`: the one place the host reads it."""
    return float(metrics["loss_sum"]) / metrics["steps"]
