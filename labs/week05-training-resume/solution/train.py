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


def save_checkpoint(state: dict, path: Path) -> None:
    """Write `state` so that `path` holds either the old checkpoint or the new one, whatever happens."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")  # same folder, so the rename below stays on one filesystem
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)  # atomic on POSIX and Windows: readers see the old file or the new, never half


def load_checkpoint(path: Path) -> dict:
    # weights_only=False: the RNG states are Python and NumPy objects, and this file is our own
    return torch.load(path, weights_only=False)


def capture_state(step, model, optimizer, scheduler, batches) -> dict:
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "data": batches.state_dict(),
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
    }


def restore_state(state: dict, model, optimizer, scheduler, batches) -> int:
    """Put every piece back as it was when `state` was captured; returns the number of finished steps."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    batches.load_state_dict(state["data"])
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    return state["step"]


def lr_factor(step: int, total_steps: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak rate."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, total_steps - WARMUP_STEPS)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def train(run_dir, total_steps, *, save_every=5, device="cpu", precision="fp32", on_step=None):
    """Train to `total_steps`, resuming from run_dir's checkpoint if there is one.

    Calls on_step(step, loss, inputs) after every optimiser step (steps count from 1) and returns
    (model, optimizer, scheduler, batches).
    """
    path = Path(run_dir) / CHECKPOINT
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = GPT(TRAIN_CONFIG, seed=0).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps))
    batches = Batches(TRAIN_CONFIG, BATCH_SIZE)
    done = restore_state(load_checkpoint(path), model, optimizer, scheduler, batches) if path.exists() else 0

    for step in range(done + 1, total_steps + 1):
        inputs, targets = batches.next(device)
        # bf16 autocast needs no gradient scaling: bf16 has fp32's exponent range
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                            enabled=precision == "bf16"):
            _, loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step(step, loss.detach(), inputs)
        if step % save_every == 0 or step == total_steps:
            save_checkpoint(capture_state(step, model, optimizer, scheduler, batches), path)
    return model, optimizer, scheduler, batches
