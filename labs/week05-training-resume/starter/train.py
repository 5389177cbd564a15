"""Week 5: a training loop for the kit GPT that can be killed at any moment and resumed exactly.

`infracourse grade week05` runs `train` to the end once; then runs it again, SIGKILLs the process at a
random step, runs it once more to resume from your checkpoint, and compares every loss and the final
state of both runs. It also kills a `save_checkpoint` half-way through writing.
"""
from __future__ import annotations

import math
import os
import random
from pathlib import Path

import numpy as np
import torch

from infracourse.kit.gpt import GPT
from infracourse.kit.train import TRAIN_CONFIG, Batches

CHECKPOINT = "checkpoint.pt"
BATCH_SIZE = 4
LR, WARMUP_STEPS = 3e-3, 5
INIT_SCALE, GROWTH_INTERVAL = 2.0 ** 10, 2  # fp16's GradScaler(init_scale=..., growth_interval=...)


def save_checkpoint(state: dict, path: Path) -> None:
    """Write `state` so that `path` holds either the old checkpoint or the new one, whatever happens."""
    # TODO(week05): a process killed half-way through this function must leave a loadable file at `path`.
    raise NotImplementedError("save_checkpoint(): write the state atomically (see the TODO in train.py)")


def load_checkpoint(path: Path) -> dict:
    # TODO(week05): the inverse of save_checkpoint.
    raise NotImplementedError("load_checkpoint(): read back what save_checkpoint wrote")


def capture_state(step, model, optimizer, scheduler, batches, scaler) -> dict:
    # TODO(week05): everything the next step depends on. Which random generators does Batches draw from?
    raise NotImplementedError("capture_state(): collect the step, the state_dicts and every RNG state")


def restore_state(state: dict, model, optimizer, scheduler, batches, scaler) -> int:
    """Put every piece back as it was when `state` was captured; returns the number of finished steps."""
    # TODO(week05): the inverse of capture_state.
    raise NotImplementedError("restore_state(): load every state_dict and RNG state back")


def lr_factor(step: int, total_steps: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak rate."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, total_steps - WARMUP_STEPS)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def train(run_dir, total_steps, *, save_every=5, device="cpu", precision="fp32", on_step=None):
    """Train to `total_steps`, resuming from run_dir's checkpoint if there is one.

    Calls on_step(step, loss, inputs) after every optimiser step (steps count from 1) and returns
    (model, optimizer, scheduler, batches, scaler).
    """
    path = Path(run_dir) / CHECKPOINT
    # TODO(week05): seed Python, NumPy and torch; build GPT(TRAIN_CONFIG, seed=0) on `device`, AdamW
    # (lr=LR, betas=(0.9, 0.95), weight_decay=0.1), a LambdaLR over lr_factor, and Batches(TRAIN_CONFIG,
    # BATCH_SIZE), and a torch.amp.GradScaler (INIT_SCALE, GROWTH_INTERVAL, enabled only for "fp16");
    # restore from `path` if it exists; then loop to total_steps: forward (under bf16 autocast when
    # precision == "bf16", fp16 when "fp16"), backward and step through the scaler, on_step(...), and a
    # checkpoint every save_every.
    raise NotImplementedError("train(): write the training loop (see the TODO in train.py)")
