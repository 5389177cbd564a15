"""Week 5 checkpoint writes: a process killed while saving must leave a checkpoint that loads (old or new)."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infracourse.guard import LabCheckFailed

DRIVER = Path(__file__).with_name("run_training.py")
NOT_WRITTEN = 2


@pytest.mark.check("checkpoint-atomic")
def test_kill_while_saving(learner, tmp_path):
    checkpoint, marker = tmp_path / "checkpoint.pt", tmp_path / "opened-in-place"
    proc = subprocess.run([sys.executable, str(DRIVER), "kill-while-saving", str(learner.root), str(checkpoint),
                           str(marker)], capture_output=True, text=True, timeout=120)
    if proc.returncode == NOT_WRITTEN:
        raise NotImplementedError(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != -signal.SIGKILL:
        raise LabCheckFailed(
            "save_checkpoint(state, path) was given a state holding an object that kills the process when it is "
            f"serialised, but the process ended with code {proc.returncode} instead of being killed: it must "
            f"serialise the whole state it is given.\n{proc.stderr[-1000:]}")
    train = learner.module("train")
    try:
        state = train.load_checkpoint(checkpoint)
    except Exception as exc:  # any failure to load is the finding
        raise LabCheckFailed(
            f"a process killed while saving left {checkpoint.name} unloadable ({type(exc).__name__}: "
            f"{str(exc)[:200]}). torch.save(state, path) truncates path before it writes: write to a temporary "
            "file in the same folder, flush and os.fsync it, then os.replace it onto the checkpoint.") from None
    if not (isinstance(state, dict) and state.get("step") == 1 and torch.equal(state.get("payload"),
                                                                                 torch.arange(1000.0))):
        raise LabCheckFailed(f"after the killed save, load_checkpoint returned {str(state)[:200]!r}, not the state "
                             "saved before it (step 1): the previous checkpoint must survive a failed save")
    if marker.exists():
        raise LabCheckFailed(
            f"save_checkpoint opened {checkpoint.name} itself for writing: a kill between that open and the last "
            "byte leaves a truncated checkpoint. Write the bytes to a temporary file, then os.replace it.")
