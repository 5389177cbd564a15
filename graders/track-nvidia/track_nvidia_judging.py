"""The shared judging helpers of the track-nvidia graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
import json
from dataclasses import dataclass
from typing import Callable

import torch

from infracourse.grader import (LabCheckFailed, BuildInWorker, assert_close, assert_grad_close, build_inputs, dtype_name,
                                in_worker, reference_time, scaled, timed)
from infracourse.kit import hotspot
from infracourse.kit.gpt import GPTConfig
from infracourse.kit.probes import ForwardBackward


EPS = hotspot.EPS


def model_flops_per_step(cfg: GPTConfig, tokens: int) -> int:
    """The reference formula of the MFU estimate, judge side only (in kit.hotspot, mounted for run.py, an
    estimates.py returning it passed mfu-estimate): FLOPs of one training step (forward + backward = 3 x forward)
    of the course GPT over `tokens` tokens.

    Matmuls per token, forward: 2 x (weights of qkv, proj, up, down per layer, and the tied head). Attention per
    token and layer, forward: QK^T and AV over seq_len keys, 2 x 2 x seq_len x d_model (full, causal or not)."""
    C, L, T = cfg.d_model, cfg.n_layer, cfg.seq_len
    kv = cfg.kv_heads * cfg.head_dim
    weights = L * (C * (C + 2 * kv) + C * C + 2 * cfg.mlp_ratio * C * C) + C * cfg.vocab_size
    attention = L * 4 * T * C
    return 3 * tokens * (2 * weights + attention)


def norm_spec(rows: int, cols: int, dtype: torch.dtype, device: str, seed: int):
    """(x, weight = 1 + 0.5 randn, dy) of one norm call, built alike by the judge and the worker."""
    return scaled([[rows, cols], [cols], [rows, cols]], scales=[1.0, 0.5, 1.0], shifts=[0.0, 1.0, 0.0],
                  dtype=dtype_name(dtype), device=device, seed=seed)


def float64_norm(x, weight, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def unfused_forward_backward(x, weight, dy):
    """The baseline operator: the course GPT's unfused norm, forward + backward (here, course code only)."""
    return ForwardBackward(hotspot.unfused_rms_norm, EPS)(x, weight, dy)


def seconds(timing) -> float:
    """The time a GPU check compares (kit.hotspot.timed_seconds)."""
    return hotspot.timed_seconds(timing)


def on_cpu(device) -> bool:
    return not str(device).startswith("cuda")


def judge_seconds(fn: Callable, args: tuple, device, make_args=None) -> float:
    """Seconds of one fn(*args) of course code here: CPU seconds on a CPU, bench.measure on a GPU (fresh inputs
    from `make_args`, a generator spec, when given)."""
    if on_cpu(device):
        return hotspot.cpu_seconds_in_turns((fn, args))[0]
    return seconds(reference_time(fn, make_args if make_args is not None else (lambda: args)))


# Rounds of a CPU race, the first a warm-up. The least of five per side put a fused norm's real 0.85x (one row, a
# fixed cost per call) at anything from 0.66x to 1.16x among grades at three at once on two cores; the least of ten
# comes nearer each side's floor
RACE_ROUNDS = 11


def worker_race(learner, spec: BuildInWorker, args: tuple, check: Callable, control: hotspot.Repeat,
                inputs: BuildInWorker | None = None) -> tuple[float, float]:
    """(worker, control) CPU seconds of one call: the worker object `spec` (a course probe around the learner's
    code), read from the worker's kernel accounting around kit.hotspot.Repeat of as many calls as `control`
    makes, and `control` (a kit.hotspot.Repeat of the judge's course code) on this thread's clock. The two sides take
    turns, a round each, RACE_ROUNDS times, and each keeps its least round after the first: measured in separate
    windows, the same code's CPU seconds differed by up to 1.5x between windows of one grade on a shared
    2-core machine (cache and frequency), while rounds taken in turn share those conditions. With `inputs` (a
    generator spec) the worker's calls cycle through distinct inputs drawn in the worker and the judge checks
    the last call's output on its own copy of that input; otherwise every call gets `args`."""
    calls = control.calls
    repeat = learner.build(hotspot.Repeat, spec, calls, inputs)
    checked = args if inputs is None else build_inputs(inputs)(hotspot.Repeat.last_input(calls))
    clock = learner.worker.clock("cpu")
    mine = judge = float("inf")
    for round_ in range(RACE_ROUNDS):
        judge_round = hotspot.thread_seconds(control, *args)
        start = clock()
        out = repeat(*args)
        spent = clock() - start
        check(out, checked)
        if round_:
            mine, judge = min(mine, spent / calls), min(judge, judge_round / calls)
    return mine, judge


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
    what = f"({rows}, {cols}) {dtype_name(dtype)}"
    check = forward_backward_check(what)
    if on_cpu(device):  # both sides cycle through the same distinct inputs (kit.hotspot.Repeat)
        generate = build_inputs(spec)
        once = hotspot.cpu_seconds_per_call(unfused_forward_backward, generate(0), 1, rounds=1)
        control = hotspot.Repeat(unfused_forward_backward, hotspot.calls_per_round(once), generate)
        return worker_race(learner, probe, (), check, control, inputs=spec)
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


def trainer_options(size, device):
    return {"seed": 0, "device": device, "dtype": size.dtype}


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
