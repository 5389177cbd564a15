"""Week 5 checkpoint writes: a process killed while saving must leave a checkpoint that loads (old or new)."""
import os
import signal
import subprocess

import pytest
import torch

from infracourse.grading.remote import LearnerRaised
from infracourse.guard import LabCheckFailed
from infracourse.kit.resume_driver import KILLED, NOT_WRITTEN, launch


@pytest.mark.check("checkpoint-atomic")
def test_kill_while_saving(learner):
    # a folder the driver's sandbox writes and the grading worker (which loads the checkpoint) can read
    folder = learner.worker.scratch / "checkpoint-atomic"
    folder.mkdir()
    checkpoint, marker = folder / "checkpoint.pt", folder / "opened-in-place"
    proc = launch(["kill-while-saving", str(learner.root), str(checkpoint), str(marker)], snapshot=learner.root,
                  scratch=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise LabCheckFailed("save_checkpoint did not return within 120 s") from None
    if proc.returncode == NOT_WRITTEN:
        raise LearnerRaised("NotImplementedError", stderr.strip().splitlines()[-1][:2000])
    if proc.returncode not in KILLED:
        raise LabCheckFailed(
            "save_checkpoint(state, path) was given a state holding an object that kills the process when it is "
            f"serialised, but the process ended with code {proc.returncode} instead of being killed: it must "
            f"serialise the whole state it is given.\n{stderr[-1000:]}")
    train = learner.module("train")
    try:
        state = train.load_checkpoint(str(checkpoint))  # in the worker: the learner's own loader
    except LearnerRaised as exc:  # any failure to load is the finding
        raise LabCheckFailed(
            f"a process killed while saving left {checkpoint.name} unloadable ({exc.type_name}: "
            f"{exc.message[:200]}). torch.save(state, path) truncates path before it writes: write to a temporary "
            "file in the same folder, flush and os.fsync it, then os.replace it onto the checkpoint.") from None
    payload = state.get("payload") if isinstance(state, dict) else None
    if not (isinstance(state, dict) and state.get("step") == 1 and isinstance(payload, torch.Tensor)
            and torch.equal(payload, torch.arange(1000.0))):
        raise LabCheckFailed(f"after the killed save, load_checkpoint returned {str(state)[:200]!r}, not the state "
                             "saved before it (step 1): the previous checkpoint must survive a failed save")
    if marker.exists():
        raise LabCheckFailed(
            f"save_checkpoint opened {checkpoint.name} itself for writing: a kill between that open and the last "
            "byte leaves a truncated checkpoint. Write the bytes to a temporary file, then os.replace it.")
