"""Week 5 resume: an uninterrupted run against one SIGKILLed at a random step and resumed from its checkpoint.

Both runs use the learner's own train(); what is compared is what each process reports per step (loss,
a digest of the batch) and the live state the driver reads from the objects train() returned.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from infracourse.grader import LabCheckFailed, LearnerRaised, output
from infracourse.kit.resume_driver import KILLED, NOT_WRITTEN, NO_MODEL_STATE, launch

STEPS, SAVE_EVERY = 24, 3
ALONE = "uninterrupted"  # the uninterrupted run's own scratch folder, inside the check's work folder
BF16_LOSS_RTOL = 1e-3
INIT_SCALE, GROWTH_INTERVAL = 2.0 ** 10, 2  # the handout's GradScaler for fp16


@dataclass
class Run:
    steps: list[dict] = field(default_factory=list)  # {"step", "loss" (float.hex), "inputs" (digest)}
    final: dict | None = None


@dataclass
class KillAndResume:
    full: Run
    killed: Run
    resumed: Run
    kill_at: int
    seed: int
    work: Path | None = None

    def where(self) -> str:
        return f"(killed after step {self.kill_at}, seed {self.seed})"


def _train_process(learner_dir: Path, work: Path, run_dir: Path, device: str, precision: str, final: Path,
                   log: Path, stop_at: int = 0):
    """The driver confined to the learner's snapshot (read-only) and `work` (read-write: checkpoints, outputs);
    with `stop_at`, it waits after that step's line for the judge's kill (kit.resume_driver)."""
    args = ["train", str(learner_dir), str(run_dir), str(STEPS), str(SAVE_EVERY), device, precision, str(final),
            str(stop_at)]
    with log.open("w") as stderr:  # the child keeps its own handle
        return launch(args, snapshot=learner_dir, scratch=work, gpu=device == "cuda", stdout=subprocess.PIPE,
                      stderr=stderr, text=True)


def _kill(proc) -> None:
    """SIGKILL the run at once: the sandbox's whole process tree dies with the process the judge started."""
    proc.kill_tree()  # infracourse.launch's one process-group kill


def _step_line(text: str) -> dict | None:
    """One step's report, type-checked (the learner's code writes to the same stdout); None for other lines."""
    try:
        line = json.loads(text)
    except ValueError:
        return None  # the learner's own prints
    if not (isinstance(line, dict) and type(line.get("step")) is int and isinstance(line.get("loss"), str)
            and isinstance(line.get("inputs"), str)):
        return None
    try:
        float.fromhex(line["loss"])
    except ValueError:
        return None
    return line


def _finish(proc, log: Path, what: str, final: Path | None, run: Run) -> Run:
    timed_out = threading.Event()
    timer = threading.Timer(300, lambda: (timed_out.set(), _kill(proc)))
    timer.start()
    try:  # its stdout as it comes, bounded (launch.output): learner code prints there too
        run.steps += [line for text in output.lines(proc) if (line := _step_line(text))]
    except output.OutputCut:
        raise LabCheckFailed(f"the {what} printed too much; {output.CUT_NOTE}") from None
    finally:
        proc.wait()  # the timer still runs: a run that closed its stdout and went on is killed at the limit
        timer.cancel()
    if timed_out.is_set():
        raise RuntimeError(f"the {what} did not finish in 300 s")
    error = output.read_tail(log).strip()
    if proc.returncode == NOT_WRITTEN:
        # the learner's code raised it in the driver's process: graded as the worker's would be
        raise LearnerRaised("NotImplementedError", error.splitlines()[-1][:2000] if error else "train.py")
    if final is not None:
        if proc.returncode != 0:
            raise RuntimeError(f"the {what} crashed (exit code {proc.returncode}):\n{error[-1500:]}")
        try:  # written by a process the learner's code ran in: tensors and plain containers only, never objects
            run.final = torch.load(final, weights_only=True)
        except Exception as exc:  # noqa: BLE001  (whatever makes the file unreadable is the finding)
            raise LabCheckFailed(f"the state after the {what} could not be read back ({type(exc).__name__}: "
                                 f"{str(exc)[:300]}): train() must return the kit's model, a torch optimizer and "
                                 "scheduler, the kit's Batches and a torch.amp.GradScaler") from None
        if not isinstance(run.final, dict) or set(run.final) != set(RNG_HINT) | {"model", "optimizer",
                                                                                     "scheduler", "data", "scaler"}:
            raise LabCheckFailed(f"the state after the {what} is malformed")
    return run


def kill_and_resume(learner_dir: Path, work: Path, device: str, precision: str, seed: int) -> KillAndResume:
    kill_at = random.Random(seed).randint(2 * SAVE_EVERY, STEPS - 2)
    alone = work / ALONE
    for folder in (alone / "full", work / "interrupted"):
        folder.mkdir(parents=True)
    # the uninterrupted run and the one to be killed are independent: run them side by side, each in a scratch
    # folder (so a HOME) of its own. Each sandbox numbers its processes from 1, so both runs have the same pid:
    # in one HOME, whatever is named by pid (a temporary file, a cache entry being written) would be shared by
    # two live processes
    uninterrupted = _train_process(learner_dir, alone, alone / "full", device, precision, alone / "full.pt",
                                   work / "full.log")
    try:
        return _interrupt_and_resume(uninterrupted, learner_dir, work, device, precision, kill_at, seed)
    finally:
        if uninterrupted.poll() is None:  # the other run failed first: do not leave this one behind
            _kill(uninterrupted)
            uninterrupted.wait()


def _interrupt_and_resume(uninterrupted, learner_dir, work, device, precision, kill_at, seed) -> KillAndResume:
    # the run stops after step kill_at's line until killed: on a loaded machine the judge read the lines so late
    # that the run had reached its last step (and its last checkpoint) before the kill, and the resumed run
    # had nothing left to do
    proc = _train_process(learner_dir, work, work / "interrupted", device, precision, work / "x.pt",
                          work / "killed.log", stop_at=kill_at)
    killed = Run()
    try:
        for text in output.lines(proc):  # as it comes, bounded (launch.output)
            if (line := _step_line(text)) is not None:
                killed.steps.append(line)
                if line["step"] >= kill_at:
                    _kill(proc)  # whatever it is doing now: stepping, or writing a checkpoint
                    break
    except output.OutputCut:
        raise LabCheckFailed(f"the run to be interrupted printed too much; {output.CUT_NOTE}") from None
    _finish(proc, work / "killed.log", "run to be interrupted", None, killed)
    if killed.steps and killed.steps[-1]["step"] >= kill_at and proc.returncode not in KILLED:
        raise RuntimeError(f"the run to be interrupted was not ended by the kill after step {kill_at} (exit code "
                           f"{proc.returncode}):\n" + output.read_tail(work / "killed.log", 1500))
    if not killed.steps or killed.steps[-1]["step"] < kill_at:
        raise RuntimeError(f"the run to be interrupted ended before step {kill_at} (exit code {proc.returncode}):\n"
                           + output.read_tail(work / "killed.log", 1500))
    # the folder as the kill left it, for resume-follows-checkpoint (a perturbed copy is resumed there)
    shutil.copytree(work / "interrupted", work / "at-kill")

    proc = _train_process(learner_dir, work, work / "interrupted", device, precision, work / "resumed.pt",
                          work / "resumed.log")
    try:
        full = _finish(uninterrupted, work / "full.log", "uninterrupted run", work / ALONE / "full.pt", Run())
        resumed = _finish(proc, work / "resumed.log", "resumed run", work / "resumed.pt", Run())
    finally:
        if proc.poll() is None:  # the uninterrupted run failed first: the resumed one is not left running
            _kill(proc)
            proc.wait()
    return KillAndResume(full, killed, resumed, kill_at, seed, work)


def first_difference(a, b, path: str = "") -> str | None:
    """Where two nested states first differ ('' for the top level), or None when they are identical."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
        return None if same else path
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return None if np.array_equal(a, b) else path
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key}".lstrip(".")
            if (where := first_difference(a[key], b[key], f"{path}.{key}")) is not None:
                return where.lstrip(".")
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return path
        for i, (x, y) in enumerate(zip(a, b)):
            if (where := first_difference(x, y, f"{path}[{i}]")) is not None:
                return where
        return None
    return None if a == b else path


@pytest.fixture(scope="module")
def runs(learner, seed, tmp_path_factory) -> KillAndResume:
    return kill_and_resume(learner.root, tmp_path_factory.mktemp("resume"), "cpu", "fp32", seed)


def _first_loss_mismatch(runs: KillAndResume, rtol: float = 0.0) -> str | None:
    reference = {line["step"]: float.fromhex(line["loss"]) for line in runs.full.steps}
    for part, run in (("before the kill", runs.killed), ("after resuming", runs.resumed)):
        for line in run.steps:
            want, got = reference.get(line["step"]), float.fromhex(line["loss"])
            if want is None or abs(got - want) > rtol * abs(want):
                return (f"step {line['step']} {part}: loss {got!r}, uninterrupted run {want!r} "
                        f"(allowed difference {rtol:g} relative)")
    return None


@pytest.mark.check("resume-losses")
def test_losses(runs, record):
    if len(runs.full.steps) != STEPS:
        raise LabCheckFailed(f"the uninterrupted run reported {len(runs.full.steps)} steps, expected {STEPS}: "
                             "call on_step once after every optimiser step")
    mismatch = _first_loss_mismatch(runs)
    record("kill step", runs.kill_at)
    if mismatch:
        raise LabCheckFailed(
            f"{mismatch} {runs.where()}. On CPU with one thread and deterministic algorithms every loss must be "
            "bit-identical. A difference before the kill means the run itself is not reproducible (seed Python, "
            "NumPy and torch at the start); after resuming, something that shapes the step was not restored.")


@pytest.mark.check("resume-step")
def test_step(runs):
    steps = [line["step"] for line in runs.resumed.steps]
    if not steps:
        raise LabCheckFailed(f"the resumed run reported no step {runs.where()}: it must call on_step after each "
                             f"step from the one after the checkpoint's to step {STEPS}")
    if steps[0] == 1:
        raise LabCheckFailed(f"the resumed run started again from step 1 {runs.where()}: train() must load "
                             "run_dir/checkpoint.pt when it exists and continue after the step it holds")
    last_before_kill = runs.killed.steps[-1]["step"]
    if steps[0] > last_before_kill + 1:
        raise LabCheckFailed(f"the resumed run began at step {steps[0]}, but the killed run had only finished step "
                             f"{last_before_kill} {runs.where()}: steps were skipped")
    if steps != list(range(steps[0], STEPS + 1)):
        raise LabCheckFailed(f"after resuming the steps ran {steps[:3]}...{steps[-3:]}; expected every step from "
                             f"{steps[0]} to {STEPS} once, in order")
    for name, run in (("uninterrupted", runs.full), ("resumed", runs.resumed)):
        counts = {float(s["step"]) for s in run.final["optimizer"]["state"].values()}
        if counts != {float(STEPS)}:
            raise LabCheckFailed(
                f"the {name} run's optimiser took {sorted(counts)} steps, expected {STEPS} {runs.where()}. "
                "A checkpoint saved after step s must resume at step s + 1: save the number of finished steps.")


@pytest.mark.check("resume-optimizer")
def test_optimizer(runs):
    for part in ("model", "optimizer"):
        a, b = runs.full.final[part], runs.resumed.final[part]
        if part == "optimizer":
            a, b = a["state"], b["state"]  # param_groups carry the learning rate: resume-schedule's concern
        if (where := first_difference(a, b)) is not None:
            raise LabCheckFailed(
                f"after resuming, the {part} state differs from the uninterrupted run's at {part}.{where} "
                f"{runs.where()}. Save optimizer.state_dict() (Adam's exp_avg, exp_avg_sq and step per parameter) "
                "with the weights, and load both before the first resumed step.")


@pytest.mark.check("resume-schedule")
def test_schedule(runs):
    a, b = runs.full.final, runs.resumed.final
    if (where := first_difference(a["scheduler"], b["scheduler"])) is not None:
        raise LabCheckFailed(
            f"after resuming, the learning-rate scheduler differs at scheduler.{where}: last_epoch "
            f"{b['scheduler'].get('last_epoch')} against {a['scheduler'].get('last_epoch')} uninterrupted "
            f"{runs.where()}. Save scheduler.state_dict() and load it, or the schedule restarts its warm-up.")
    lrs = [[g["lr"] for g in run["optimizer"]["param_groups"]] for run in (a, b)]
    if lrs[0] != lrs[1]:
        raise LabCheckFailed(f"the final learning rate is {lrs[1]} after resuming, {lrs[0]} uninterrupted")


def resume_perturbed(learner_dir: Path, work: Path, seed: int) -> Run:
    """Resume from a copy of the killed run's checkpoint whose model weights the judge perturbed (through
    the learner's own load_checkpoint and save_checkpoint): a resume that reads the checkpoint follows it."""
    folder = work / "perturbed"
    shutil.copytree(work / "at-kill", folder)
    with (work / "perturb.log").open("w") as stderr:
        proc = launch(["perturb", str(learner_dir), str(folder / "checkpoint.pt"), str(seed)], snapshot=learner_dir,
                      scratch=work, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        code = proc.wait(timeout=120)
    if code == NO_MODEL_STATE:
        raise LabCheckFailed(
            "run_dir/checkpoint.pt holds no model state_dict (a dict with the keys and shapes of "
            "model.state_dict(), at any depth of the checkpoint): save model.state_dict() in it")
    if code != 0:
        error = output.read_tail(work / "perturb.log")
        raise RuntimeError(f"loading and saving the checkpoint again failed (exit code {code}):\n{error[-1500:]}")
    proc = _train_process(learner_dir, work, folder, "cpu", "fp32", work / "perturbed.pt", work / "perturbed.log")
    return _finish(proc, work / "perturbed.log", "run resumed from a perturbed checkpoint", work / "perturbed.pt",
                   Run())


@pytest.mark.check("resume-follows-checkpoint")
def test_follows_checkpoint(runs, learner, seed):
    work = runs.work
    perturbed = resume_perturbed(learner.root, work, seed)
    honest = {line["step"]: line for line in runs.resumed.steps}
    if not perturbed.steps or perturbed.steps[0]["step"] not in honest:
        raise LabCheckFailed(f"resumed from a checkpoint with perturbed weights, the run reported steps "
                             f"{[line['step'] for line in perturbed.steps][:5]}, not those of the plain resume")
    first = perturbed.steps[0]
    if first["loss"] == honest[first["step"]]["loss"] or first_difference(
            runs.resumed.final["model"], perturbed.final["model"]) is None:
        raise LabCheckFailed(
            f"the judge added noise to the model weights in run_dir/checkpoint.pt (through your load_checkpoint "
            f"and save_checkpoint), yet the resumed run's loss at step {first['step']} and its final weights are "
            f"those of a resume from the untouched checkpoint {runs.where()}: the resume does not take the weights "
            "from the checkpoint (replaying the first steps from the seed is not resuming). Load every state from "
            "the checkpoint and train on from there.")


RNG_HINT = {"python": "random.getstate() / random.setstate()", "numpy": "np.random.get_state() / set_state()",
            "torch": "torch.get_rng_state() / torch.set_rng_state()",
            "cuda": "torch.cuda.get_rng_state_all() / set_rng_state_all()"}


def require_same_rng(runs: KillAndResume) -> None:
    for name, how in RNG_HINT.items():
        if first_difference(runs.full.final[name], runs.resumed.final[name]) is not None:
            raise LabCheckFailed(
                f"after resuming, the {name} random generator is not where the uninterrupted run's is "
                f"{runs.where()}. The data stream draws from it, so the resumed run sees other batches. Save it "
                f"in the checkpoint and restore it ({how}).")


@pytest.mark.check("resume-rng")
def test_rng(runs):
    require_same_rng(runs)


def require_same_data(runs: KillAndResume) -> None:
    reference = {line["step"]: line["inputs"] for line in runs.full.steps}
    for line in runs.resumed.steps:
        if reference.get(line["step"]) != line["inputs"]:
            raise LabCheckFailed(f"step {line['step']} after resuming trained on a different batch than the "
                                 f"uninterrupted run {runs.where()}: data order or position was not restored")
    a, b = runs.full.final["data"], runs.resumed.final["data"]
    if (where := first_difference(a, b)) is not None:
        raise LabCheckFailed(
            f"after resuming, the data stream's state differs at data.{where} (epoch {b.get('epoch')}, position "
            f"{b.get('position')}; uninterrupted: epoch {a.get('epoch')}, position {a.get('position')}) "
            f"{runs.where()}. Save batches.state_dict() and load it.")


@pytest.mark.check("resume-data")
def test_data(runs):
    require_same_data(runs)


def require_same_scaler(runs: KillAndResume) -> None:
    full, resumed = runs.full.final["scaler"], runs.resumed.final["scaler"]
    if not (isinstance(full, dict) and full.get("growth_interval") == GROWTH_INTERVAL
            and isinstance(full.get("scale"), float) and full["scale"] != INIT_SCALE):
        raise LabCheckFailed(
            f"under fp16 the returned GradScaler's state is {str(full)[:200]}: use torch.amp.GradScaler("
            f"device_type, init_scale={INIT_SCALE:g}, growth_interval={GROWTH_INTERVAL}, enabled=precision == "
            "'fp16'), scale the loss before backward and step and update through it")
    if (where := first_difference(full, resumed)) is not None:
        raise LabCheckFailed(
            f"after resuming under fp16 the GradScaler differs at {where}: scale {resumed.get('scale')} and growth "
            f"tracker {resumed.get('_growth_tracker')}, uninterrupted {full.get('scale')} and "
            f"{full.get('_growth_tracker')} {runs.where()}. Save scaler.state_dict() in the checkpoint and load it: "
            "a scale that restarts overflows, or skips steps, at other moments than the uninterrupted run.")


@pytest.mark.check("resume-fp16-scaler")
def test_fp16_scaler(learner, seed, tmp_path_factory, record):
    """fp16 autocast with a GradScaler, killed and resumed on the CPU: the scaler's state round-trips."""
    runs = kill_and_resume(learner.root, tmp_path_factory.mktemp("resume-fp16"), "cpu", "fp16", seed)
    require_same_scaler(runs)
    mismatch = _first_loss_mismatch(runs)
    if mismatch:
        raise LabCheckFailed(f"fp16 autocast on the CPU: {mismatch} {runs.where()}")
    if (where := first_difference(runs.full.final["model"], runs.resumed.final["model"])) is not None:
        raise LabCheckFailed(f"fp16 on the CPU: after resuming the weights differ at model.{where} {runs.where()}")
    record("final loss scale", runs.full.final["scaler"]["scale"])


@pytest.mark.check("resume-fp16-gpu")
def test_fp16_on_gpu(learner, seed, tmp_path_factory, record):
    runs = kill_and_resume(learner.root, tmp_path_factory.mktemp("resume-fp16-gpu"), "cuda", "fp16", seed)
    require_same_scaler(runs)
    mismatch = _first_loss_mismatch(runs, rtol=BF16_LOSS_RTOL)
    if mismatch:
        raise LabCheckFailed(f"fp16 autocast on the GPU: {mismatch} {runs.where()}")
    require_same_rng(runs)
    require_same_data(runs)
    record("kill step", runs.kill_at)


@pytest.mark.check("resume-bf16")
def test_bf16_on_gpu(learner, seed, tmp_path_factory, record):
    runs = kill_and_resume(learner.root, tmp_path_factory.mktemp("resume-bf16"), "cuda", "bf16", seed)
    mismatch = _first_loss_mismatch(runs, rtol=BF16_LOSS_RTOL)
    if mismatch:
        raise LabCheckFailed(f"bf16 autocast on the GPU: {mismatch} {runs.where()}")
    require_same_rng(runs)
    require_same_data(runs)
    record("kill step", runs.kill_at)
