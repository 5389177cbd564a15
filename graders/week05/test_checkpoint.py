"""Week 5 checkpoint writes: a process killed while saving must leave a checkpoint that loads (old or new).

Atomic is judged by its effect, with every observer: a kill in the middle of serialising; the old file's
bytes, read through a descriptor the judge opened on it before the save (a write in place, through any
name, a symlink or a copy from another filesystem, changes them; a rename does not); and what the
checkpoint's path holds at every audited file event of the save (never missing, never partial)."""
import hashlib
import json
import os
import subprocess

import pytest
import torch

from infracourse.grader import LabCheckFailed, LearnerRaised, output
from infracourse.kit.resume_driver import KILLED, NOT_WRITTEN, file_digest, launch, read_all


FIX = ("Write the bytes to a temporary file in the checkpoint's own folder, flush and os.fsync it, then "
       "os.replace it onto the checkpoint: a rename swaps the name to a complete file in one step.")


def _drive(learner, folder, command: str, *args) -> tuple[int, str]:
    """Run kit.resume_driver's `command` on the learner's snapshot (sandboxed); (exit code, stderr)."""
    captured = output.Capture(folder.parent / f"{folder.name}-{command}.log")  # cut past output.OUTPUT_LIMIT
    proc = captured.spawn(lambda log: launch([command, str(learner.root), *map(str, args)], snapshot=learner.root,
                                             scratch=folder, stdout=subprocess.DEVNULL, stderr=log))
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill_tree()  # the sandbox's whole process tree (infracourse.launch)
        raise LabCheckFailed("save_checkpoint did not return within 120 s") from None
    captured.finish()
    if captured.cut:
        raise LabCheckFailed(f"save_checkpoint printed too much; {output.CUT_NOTE}")
    stderr = captured.tail()
    if proc.returncode == NOT_WRITTEN:
        raise LearnerRaised("NotImplementedError", stderr.strip().splitlines()[-1][:2000])
    return proc.returncode, stderr


def _save(learner, folder, checkpoint, step: int, observed) -> None:
    returncode, stderr = _drive(learner, folder, "save", checkpoint, step, observed)
    if returncode != 0:
        raise LabCheckFailed(f"save_checkpoint crashed (exit code {returncode}):\n{stderr[-1000:]}")


def require_replaced_whole(learner) -> None:
    """The effect of an atomic save: the old file is never written, the path never missing or partial."""
    folder = learner.worker.scratch / "checkpoint-replaced"
    folder.mkdir()
    checkpoint = folder / "checkpoint.pt"
    _save(learner, folder, checkpoint, 1, folder / "first.json")
    fd = os.open(checkpoint, os.O_RDONLY)  # the judge's own view of the old file, whatever its name becomes
    try:
        old = read_all(fd)
        _save(learner, folder, checkpoint, 2, folder / "second.json")
        os.lseek(fd, 0, os.SEEK_SET)
        after = read_all(fd)
    finally:
        os.close(fd)
    if after != old:
        raise LabCheckFailed(
            f"save_checkpoint wrote into the existing {checkpoint.name} (its old bytes changed under a descriptor "
            "opened before the save): a kill during that write leaves a partial checkpoint, whatever name or "
            f"filesystem the bytes came through. {FIX}")
    new, old_digest = file_digest(checkpoint), hashlib.sha1(old).hexdigest()
    try:  # written by a process the learner's code ran in: untrusted data
        samples = json.loads((folder / "second.json").read_text())
        seen = [(str(event), str(digest)) for event, digest in samples]
    except (OSError, ValueError, TypeError):
        raise LabCheckFailed("the record of the second save could not be read back") from None
    if new in ("missing", old_digest) or not seen or seen[-1][1] != new:
        raise LabCheckFailed(f"after save_checkpoint returned, {checkpoint.name} does not hold the new state")
    for event, digest in seen:
        if digest not in (old_digest, new):
            what = "missing" if digest == "missing" else "neither the old file nor the new one (partial)"
            raise LabCheckFailed(f"during save_checkpoint, at a file event {event!r}, {checkpoint.name} was {what}: "
                                 f"a reader (or a restart) at that moment finds no checkpoint. {FIX}")


@pytest.mark.check("checkpoint-atomic")
def test_kill_while_saving(learner):
    # a folder the driver's sandbox writes and the grading worker (which loads the checkpoint) can read
    folder = learner.worker.scratch / "checkpoint-atomic"
    folder.mkdir()
    checkpoint, marker = folder / "checkpoint.pt", folder / "opened-in-place"
    returncode, stderr = _drive(learner, folder, "kill-while-saving", checkpoint, marker)
    if returncode not in KILLED:
        raise LabCheckFailed(
            "save_checkpoint(state, path) was given a state holding an object that kills the process when it is "
            f"serialised, but the process ended with code {returncode} instead of being killed: it must "
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
    require_replaced_whole(learner)
