"""NVIDIA track graders: the learner's norm, the project's size on this device, the judge's own baseline, and
the learner's norm measured at the model's shape and inside the training step.

The baseline (the course GPT with its own unfused RMSNorm) is course code timed and counted here. The
learner's norm runs only in the grading worker: its forward + backward through kit.probes.ForwardBackward and
its training step through kit.probes.GPTTrainer. On a GPU both sides are timed by perf.timed / reference_time
(CUDA events, the judge's device-wide clock, outputs of timed calls checked here). On a CPU shared with other
work a wall clock mostly measures the other work, and the worker's process may get less of the cores than the
judge's: there each side is timed by the CPU seconds it spent, the judge's by time.process_time and the
worker's by the kernel's per-thread accounting that the judge reads (Worker.clock, which learner code cannot
write), around kit.hotspot.Repeat of many calls; the last output is checked here. Both measurements are made
once per grade and shared by the checks."""
import dataclasses
import json
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from infracourse.grader import (CallRecord, LabCheckFailed, WorkerObject, assert_close, assert_grad_close, build_inputs,
                                dtype_name as _name, in_worker, reference_time, scaled, timed, tokens)
from infracourse.kit import gpt
from infracourse.kit import probes
from infracourse.kit import hotspot
from infracourse.kit.probes import ForwardBackward, GPTTrainer

EPS = hotspot.EPS


@pytest.fixture(scope="session")
def norm(learner, device):
    module = learner.module("fused_norm")
    # the timings of both sides with one intra-op thread on a CPU (kit.hotspot.timing_threads): here and in the worker
    hotspot.timing_threads(device)
    learner.build(hotspot.timing_threads, device)
    return module


@pytest.fixture(scope="session")
def size(device):
    return hotspot.project_size(device)


def norm_spec(rows: int, cols: int, dtype: torch.dtype, device: str, seed: int):
    """(x, weight = 1 + 0.5 randn, dy) of one norm call, built alike by the judge and the worker."""
    return scaled([[rows, cols], [cols], [rows, cols]], scales=[1.0, 0.5, 1.0], shifts=[0.0, 1.0, 0.0],
                  dtype=_name(dtype), device=device, seed=seed)


def float64_norm(x, weight, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def unfused_forward_backward(x, weight, dy):
    """The baseline operator: the course GPT's unfused norm, forward + backward (here, course code only)."""
    return ForwardBackward(hotspot.unfused_rms_norm, EPS)(x, weight, dy)


def seconds(timing) -> float:
    """The time a GPU check compares (kit.hotspot.timed_seconds)."""
    return hotspot.timed_seconds(timing)


ROUND_S = 0.15  # CPU seconds of one round of calls on a CPU (5 rounds after a warm-up, the least kept)


def on_cpu(device) -> bool:
    return not str(device).startswith("cuda")


def judge_seconds(fn: Callable, args: tuple, device, make_args=None) -> float:
    """Seconds of one fn(*args) of course code here: CPU seconds on a CPU, bench.measure on a GPU (fresh inputs
    from `make_args`, a generator spec, when given)."""
    if on_cpu(device):
        once = hotspot.cpu_seconds_per_call(fn, args, 1, rounds=1)
        return hotspot.cpu_seconds_per_call(fn, args, max(2, int(ROUND_S / max(once, 1e-6))))
    return seconds(reference_time(fn, make_args if make_args is not None else (lambda: args)))


def worker_seconds(learner, spec: WorkerObject, args: tuple, check: Callable, estimate_s: float,
                   inputs: WorkerObject | None = None) -> float:
    """CPU seconds of one call of the worker object `spec` (a course probe around the learner's code), read from
    the worker's kernel accounting around kit.hotspot.Repeat of enough calls for a round of ROUND_S; the least
    over five rounds after a warm-up. With `inputs` (a generator spec) the calls cycle through distinct inputs
    drawn in the worker and the judge checks the last call's output on its own copy of that input; otherwise
    every call gets `args`."""
    calls = max(2, int(ROUND_S / max(estimate_s, 1e-6)))
    repeat = learner.build(hotspot.Repeat, spec, calls, inputs)
    checked = args if inputs is None else build_inputs(inputs)(hotspot.Repeat.last_input(calls))
    clock = learner.worker.clock("cpu")
    best = float("inf")
    for round_ in range(6):
        start = clock()
        out = repeat(*args)
        spent = clock() - start
        check(out, checked)
        if round_:
            best = min(best, spent / calls)
    return best


def forward_backward_check(what: str) -> Callable:
    def check(out, args):
        if not isinstance(out, tuple) or len(out) != 3:
            raise LabCheckFailed(f"a timed rms_norm forward + backward {what} did not give (y, dx, dw)")
        x, weight, dy = (a.detach().double().requires_grad_() for a in args)
        expected = float64_norm(x, weight)
        dx, dw = torch.autograd.grad(expected, (x, weight), dy)
        assert_close(out[0], expected, what=f"a timed rms_norm output {what}")
        assert_grad_close(out[1], dx, what=f"a timed dx {what}")
        assert_grad_close(out[2], dw, what=f"a timed dw {what}")
    return check


def operator_race(norm, learner, rows, cols, dtype, device, seed):
    """(yours, unfused) seconds of one norm's forward + backward at (rows, cols): the learner's in the worker,
    the outputs of timed calls compared with float64 autograd; the unfused one here, on inputs of the spec."""
    spec = norm_spec(rows, cols, dtype, device, seed)
    probe = in_worker(ForwardBackward, norm.rms_norm, EPS)
    what = f"({rows}, {cols}) {_name(dtype)}"
    check = forward_backward_check(what)
    if on_cpu(device):  # both sides cycle through the same distinct inputs (kit.hotspot.Repeat)
        generate = build_inputs(spec)
        once = hotspot.cpu_seconds_per_call(unfused_forward_backward, generate(0), 1, rounds=1)
        calls = max(2, int(ROUND_S / max(once, 1e-6)))
        theirs = hotspot.cpu_seconds_per_call(hotspot.Repeat(unfused_forward_backward, calls, generate), (), 1) / calls
        return worker_seconds(learner, probe, (), check, theirs, inputs=spec), theirs
    yours = learner.worker.build(probe)
    mine = timed(yours, spec, check=check, label=f"rms_norm forward + backward {what}")
    return seconds(mine), seconds(reference_time(unfused_forward_backward, spec))


@dataclass
class Baseline:
    step_s: float
    norm_s: float
    share: float
    step: hotspot.Counts
    norm_call: hotspot.Counts  # one unfused norm's forward + backward


@dataclass
class Effect:
    step_s: float
    baseline_step_s: float  # the faster of the baseline step's two measurements
    norm_s: float
    unfused_norm_s: float
    operator_speedup: float
    end_to_end: float
    step: hotspot.Counts


def _options(size, device):
    return {"seed": 0, "device": device, "dtype": size.dtype}


@pytest.fixture(scope="session")
def baseline(size, device):
    """The judge's baseline, measured once per grade: the course GPT with its own unfused norm."""
    hotspot.timing_threads(device)
    trainer = GPTTrainer(size.config, None, **_options(size, device))
    batches = tokens(dataclasses.asdict(size.config), size.batch, device=device, seed=1)
    spec = norm_spec(*size.norm_shape, size.dtype, device, seed=2)
    step_s = judge_seconds(trainer, build_inputs(batches)(0), device, make_args=batches)
    norm_s = judge_seconds(unfused_forward_backward, build_inputs(spec)(0), device, make_args=spec)
    step_counts = hotspot.count_call(trainer, *build_inputs(batches)(10**7))
    norm_counts = hotspot.count_call(unfused_forward_backward, *build_inputs(spec)(10**7))
    return Baseline(step_s, norm_s, hotspot.hotspot_share(norm_s, step_s, size), step_counts, norm_counts)


@pytest.fixture(scope="session")
def effect(norm, learner, size, device, baseline):
    """The learner's norm measured separately at the model's norm shape and inside the training step."""
    config = dataclasses.asdict(size.config)
    batches = tokens(config, size.batch, device=device, seed=3)
    reference = GPTTrainer(size.config, None, **_options(size, device))
    yours_args = (in_worker(gpt.GPTConfig, **config), norm.rms_norm)
    yours = learner.build(probes.GPTTrainer, *yours_args, **_options(size, device))
    idx, targets = build_inputs(batches)(10**7)  # a batch no timed step uses
    expected, got = reference.loss(idx, targets), yours.loss(idx, targets)
    bound = 1e-4 if size.dtype == torch.float32 else 2e-2
    if not isinstance(got, float) or not abs(got - expected) <= bound * abs(expected):
        shown = f"{got:.6g}" if isinstance(got, float) else repr(got)[:60]
        raise LabCheckFailed(f"the course GPT's loss with your rms_norm is {shown}, with its own norm {expected:.6g} "
                             f"({_name(size.dtype)}, {size.describe()}): plugging the operator in must not change "
                             "the model. Check rms_norm on 3-D (batch, seq, hidden) inputs with the model's weight")
    counted = yours.call((idx, targets), watch={"poison": False})
    step_counts = hotspot.counts_of(CallRecord.from_evidence(counted.record))

    def check(loss, args):
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not torch.isfinite(loss).all():
            raise LabCheckFailed("a timed training step with your rms_norm did not give a finite loss")

    if on_cpu(device):
        trainer = in_worker(GPTTrainer, *yours_args, **_options(size, device))
        step_s = worker_seconds(learner, trainer, (idx, targets), check, baseline.step_s)
        baseline_s = min(baseline.step_s, judge_seconds(reference, (idx, targets), device))
    else:  # each side in two windows, the faster kept: a burst of other work in one window does not decide
        step_s = min(seconds(timed(yours, batches, check=check, label="a training step of the course GPT with "
                                   "your norm", calls=16)) for _ in range(2))
        baseline_s = min(baseline.step_s, seconds(reference_time(reference, batches)))
    mine, unfused = operator_race(norm, learner, *size.norm_shape, size.dtype, device, seed=4)
    return Effect(step_s=step_s, baseline_step_s=baseline_s, norm_s=mine, unfused_norm_s=unfused,
                  operator_speedup=unfused / mine, end_to_end=baseline_s / step_s, step=step_counts)


def read_raw(learner, name: str, device: str, size) -> dict:
    """A JSON file the learner's run wrote under raw/, measured on this kind of device at the project's size."""
    path = learner.path(f"raw/{name}")
    if not path.exists():
        raise LabCheckFailed(f"raw/{name} is missing: run.py writes it (run your project's command, `python run.py "
                             "--out raw`, on this machine and keep what it writes)")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise LabCheckFailed(f"raw/{name} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise LabCheckFailed(f"raw/{name} must hold one JSON object")
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    if data.get("device") != kind:
        raise LabCheckFailed(f"raw/{name} was measured on {data.get('device')!r}, this grade runs on {kind!r}: "
                             "raw data must come from the machine graded. Run `python run.py --out raw` here")
    if "config" in data and data["config"] != size.describe():
        raise LabCheckFailed(f"raw/{name} measured the model {data['config']}, the project's size on this device is "
                             f"{size.describe()} (kit.hotspot.project_size): measure that one")
    return data


def number(data: dict, key: str, name: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise LabCheckFailed(f"raw/{name} lacks the number {key!r} (found {value!r})")
    return float(value)
