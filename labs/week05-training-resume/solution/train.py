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
# fp16: the loss scale starts at 2**10 and doubles after every 2 steps without an overflow, so within a few
# dozen steps it overflows, skips a step and halves: the scaler's state shapes the run
INIT_SCALE, GROWTH_INTERVAL = 2.0 ** 10, 2


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


def capture_state(step, model, optimizer, scheduler, batches, scaler) -> dict:
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "data": batches.state_dict(),
        "scaler": scaler.state_dict(),  # the loss scale and its growth tracker ({} unless fp16)
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
    }


def restore_state(state: dict, model, optimizer, scheduler, batches, scaler) -> int:
    """Put every piece back as it was when `state` was captured; returns the number of finished steps."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    batches.load_state_dict(state["data"])
    scaler.load_state_dict(state["scaler"])
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
    (model, optimizer, scheduler, batches, scaler).
    """
    path = Path(run_dir) / CHECKPOINT
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = GPT(TRAIN_CONFIG, seed=0).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps))
    batches = Batches(TRAIN_CONFIG, BATCH_SIZE)
    device_type = torch.device(device).type
    scaler = torch.amp.GradScaler(device_type, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL,
                                  enabled=precision == "fp16")
    done = restore_state(load_checkpoint(path), model, optimizer, scheduler, batches, scaler) \
        if path.exists() else 0

    for step in range(done + 1, total_steps + 1):
        inputs, targets = batches.next(device)
        # bf16 needs no loss scaling (it has fp32's exponent range); fp16 gradients underflow without it
        with torch.autocast(device_type=device_type, dtype=torch.float16 if precision == "fp16" else torch.bfloat16,
                            enabled=precision != "fp32"):
            _, loss = model(inputs, targets)
        scaler.scale(loss).backward()  # a disabled scaler passes the loss and the step through unchanged
        scaler.step(optimizer)  # skips the step when a gradient overflowed
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step(step, loss.detach(), inputs)
        if step % save_every == 0 or step == total_steps:
            save_checkpoint(capture_state(step, model, optimizer, scheduler, batches, scaler), path)
    return model, optimizer, scheduler, batches, scaler
