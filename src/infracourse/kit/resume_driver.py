"""Runs a learner's week-5 training code in a confined process of its own, for the week-5 graders.

The grader must SIGKILL training at a step of its choosing, so the training runs in a process the judge can
kill, not in the grading worker. `launch` starts this module inside the sandbox (infracourse.sandbox: the
learner's snapshot read-only, a scratch folder read-write where the run's checkpoints and outputs go); the
judge reads what it wrote there as untrusted data (JSON lines, and a state file loaded with
torch.load(weights_only=True), which rebuilds tensors and plain containers only).

  python -m infracourse.kit.resume_driver train LEARNER RUN_DIR STEPS SAVE_EVERY DEVICE PRECISION FINAL [STOP]
      calls train(); prints one JSON line per step, flushed, so the grader can SIGKILL it at a step of its
      choosing; at a normal end writes FINAL: the live state after training (model, optimiser, scheduler,
      data position, loss scaler, every RNG), read from the objects train() returned, never from the learner's checkpoint.
      With STOP, the step-STOP line is the last: the run waits there for the grader's SIGKILL, so a judge that
      reads the lines late (a loaded machine) still kills it at that step, never after it ran to its end.
  python -m infracourse.kit.resume_driver kill-while-saving LEARNER CHECKPOINT MARKER
      saves a first state, then a second one holding an object that SIGKILLs the process while it is being
      serialised; writes MARKER if anything opened CHECKPOINT itself for writing.
  python -m infracourse.kit.resume_driver perturb LEARNER CHECKPOINT SEED
      loads CHECKPOINT with the learner's load_checkpoint, adds seeded noise to every floating tensor of the
      model's state_dict in it (the dict whose keys are the kit GPT's), and saves it back with the learner's
      save_checkpoint: a run resumed from it must follow it (one that replays from the seed does not). Exit
      code 3 when the checkpoint holds no such dict.
  python -m infracourse.kit.resume_driver save LEARNER CHECKPOINT STEP OBSERVED
      save_checkpoint({"step": STEP, "payload": ...}, CHECKPOINT); at every audited event during the save (each
      open, rename, remove, ...) samples what CHECKPOINT holds (its bytes' digest, or "missing") and writes the
      samples to OBSERVED as JSON: the judge holds each one against the old and the new file.
A NotImplementedError in the learner's code ends the process with code 2 and its message on stderr.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

NOT_WRITTEN = 2
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)  # a direct child, or the sandbox's init reporting its child


def launch(args: list[str], *, snapshot: Path, scratch: Path, gpu: bool = False, **popen) -> subprocess.Popen:
    """Start this driver confined like the grading worker (infracourse.launch), in a session of its own."""
    from infracourse import launch as launcher  # why: the judge's half; the driver half runs confined

    env = launcher.environment(scratch, CUBLAS_WORKSPACE_CONFIG=":4096:8")  # deterministic cuBLAS on a GPU
    return launcher.start([sys.executable, "-s", "-m", "infracourse.kit.resume_driver", *args], scratch=scratch,
                          snapshot=snapshot, gpu=gpu, env=env, **popen)


def _plain(state):
    """NumPy's generator state as tensors and ints, so the judge can load it without unpickling objects."""
    import numpy as np
    import torch

    if isinstance(state, np.ndarray):
        return torch.from_numpy(state.astype(np.int64))
    if isinstance(state, tuple):
        return tuple(_plain(s) for s in state)
    return state


def _train(learner, run_dir, steps, save_every, device, precision, final, stop="0"):
    import numpy as np
    import torch

    torch.set_num_threads(1)  # one thread: CPU kernels then sum in one fixed order, run after run
    if device == "cuda":  # (on the CPU every op this model uses is deterministic already; the switch costs
        torch.use_deterministic_algorithms(True, warn_only=True)  # seconds of imports)
    import train

    def on_step(step, loss, inputs):
        digest = hashlib.sha1(inputs.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
        print(json.dumps({"step": int(step), "loss": float(loss).hex(), "inputs": digest}), flush=True)
        if int(step) == int(stop):
            while True:  # the grader's SIGKILL ends it here
                time.sleep(60)

    result = train.train(run_dir, int(steps), save_every=int(save_every), device=device, precision=precision,
                         on_step=on_step)
    if not (isinstance(result, tuple) and len(result) == 5):
        raise TypeError(f"train() returned {type(result).__name__}; it must return "
                        "(model, optimizer, scheduler, batches, scaler)")
    model, optimizer, scheduler, batches, scaler = result
    torch.save({
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "data": batches.state_dict(), "scaler": scaler.state_dict(),
        "python": random.getstate(), "numpy": _plain(np.random.get_state()),
        "torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if device == "cuda" else [],
    }, final)


class _KillWhileSerialised:
    """Pickling this object SIGKILLs the process: a crash in the middle of writing a checkpoint."""

    def __reduce_ex__(self, protocol):
        os.kill(os.getpid(), signal.SIGKILL)


def _kill_while_saving(learner, checkpoint, marker):
    import torch

    import train

    checkpoint = os.path.abspath(checkpoint)
    train.save_checkpoint({"step": 1, "payload": torch.arange(1000.0)}, Path(checkpoint))

    def watch(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = args[1], args[2]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags > 0 and flags & (os.O_WRONLY | os.O_RDWR))
            if writes and os.path.abspath(os.fsdecode(args[0])) == checkpoint and not os.path.exists(marker):
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT)
                os.close(fd)

    sys.addaudithook(watch)
    train.save_checkpoint({"step": 2, "payload": torch.zeros(1000), "crash": _KillWhileSerialised()},
                          Path(checkpoint))


NO_MODEL_STATE = 3


def _perturb(learner, checkpoint, seed):
    import torch

    import train  # why: the driver's half, confined, beside the learner's train.py; the judge's never loads them
    from infracourse.kit.gpt import GPT
    from infracourse.kit.train import TRAIN_CONFIG

    want = {k: tuple(v.shape) for k, v in GPT(TRAIN_CONFIG, seed=0).state_dict().items()}
    state = train.load_checkpoint(Path(checkpoint))
    gen = torch.Generator().manual_seed(int(seed))
    found, stack = 0, [state]
    while stack:  # every dict in the checkpoint, however nested; the model's is the one with the kit's keys
        item = stack.pop()
        values = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else ()
        if isinstance(item, dict) and set(item) == set(want) and all(
                isinstance(v, torch.Tensor) and tuple(v.shape) == want[k] for k, v in item.items()):
            for value in item.values():
                if value.is_floating_point():
                    value.add_(0.2 * torch.randn(value.shape, generator=gen).to(value.dtype))
            found += 1
        else:
            stack.extend(values)
    if not found:
        return NO_MODEL_STATE
    train.save_checkpoint(state, Path(checkpoint))
    print(json.dumps({"perturbed": found}), flush=True)
    return 0


def read_all(fd: int) -> bytes:
    """Every byte from fd's position to the end."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def file_digest(path) -> str:
    """The bytes of `path` as a digest, read with os calls (they raise no audit event of their own)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return "missing"
    try:
        return hashlib.sha1(read_all(fd)).hexdigest()
    finally:
        os.close(fd)


def _save_observed(learner, checkpoint, step, observed):
    import torch

    import train

    checkpoint, samples, busy = os.path.abspath(checkpoint), [], [False]

    def watch(event, args):
        if busy[0] or not event.startswith(("open", "os.", "shutil.")):
            return
        busy[0] = True  # os.open below is audited itself
        try:
            samples.append([event, file_digest(checkpoint)])
        finally:
            busy[0] = False

    state = {"step": int(step), "payload": torch.arange(250_000.0) * int(step)}  # 1 MB: a write takes a while
    sys.addaudithook(watch)
    train.save_checkpoint(state, Path(checkpoint))
    busy[0] = True  # no more samples: the save is over
    samples.append(["returned", file_digest(checkpoint)])
    with open(observed, "w") as f:
        json.dump(samples, f)
    return 0


def main(argv):
    mode, learner, *rest = argv
    # the learner's folder heads the import path, in place of the start folder (the scratch dir)
    sys.path[:] = [learner] + [p for p in sys.path[1:] if p not in ("", os.getcwd())]
    try:
        code = {"train": _train, "kill-while-saving": _kill_while_saving, "perturb": _perturb,
                "save": _save_observed}[mode](learner, *rest)
    except NotImplementedError as exc:
        print(f"{exc}", file=sys.stderr)
        return NOT_WRITTEN
    return code or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
