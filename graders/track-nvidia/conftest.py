"""NVIDIA track graders: the learner's norm, the project's size on this device, the judge's own baseline, and
the learner's norm measured at the model's shape and inside the training step.

The baseline (the course GPT with its own unfused RMSNorm) is course code timed and counted here. The
learner's norm runs only in the grading worker: its forward + backward through kit.probes.ForwardBackward and
its training step through kit.probes.GPTTrainer. On a GPU both sides are timed by perf.timed / reference_time
(CUDA events, the judge's device-wide clock, outputs of timed calls checked here). On a CPU shared with other
work a wall clock mostly measures the other work, and the worker's process may get less of the cores than the
judge's: there each side is timed by the CPU seconds it spent, the judge's by time.thread_time and the
worker's by the kernel's per-thread accounting that the judge reads (WorkerLoop.clock, which learner code cannot
write), around kit.hotspot.Repeat of many calls; the last output is checked here. Both measurements are made
once per grade and shared by the checks."""
import dataclasses

import pytest
import torch

from infracourse.grader import (CallRecord, LabCheckFailed, build_inputs, dtype_name, in_worker, reference_time, timed,
                                tokens)
from infracourse.kit import gpt, hotspot, probes
from infracourse.kit.probes import GPTTrainer
from track_nvidia_judging import (Baseline, Effect, judge_seconds, norm_spec, on_cpu, operator_race, seconds,
                                  trainer_options, unfused_forward_backward, worker_race)


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


@pytest.fixture(scope="session")
def baseline(size, device):
    """The judge's baseline, measured once per grade: the course GPT with its own unfused norm."""
    hotspot.timing_threads(device)
    trainer = GPTTrainer(size.config, None, **trainer_options(size, device))
    batches = tokens(dataclasses.asdict(size.config), size.batch, device=device, seed=1)
    spec = norm_spec(*size.norm_shape, size.dtype, device, seed=2)
    step_args, norm_args = build_inputs(batches)(0), build_inputs(spec)(0)
    if on_cpu(device):  # a share is a ratio: its two times are taken in turns (kit.hotspot.cpu_seconds_in_turns)
        step_s, norm_s = hotspot.cpu_seconds_in_turns((trainer, step_args), (unfused_forward_backward, norm_args))
    else:
        step_s = judge_seconds(trainer, step_args, device, make_args=batches)
        norm_s = judge_seconds(unfused_forward_backward, norm_args, device, make_args=spec)
    step_counts = hotspot.count_call(trainer, *build_inputs(batches)(10**7))
    norm_counts = hotspot.count_call(unfused_forward_backward, *build_inputs(spec)(10**7))
    return Baseline(step_s, norm_s, hotspot.hotspot_share(norm_s, step_s, size), step_counts, norm_counts)


@pytest.fixture(scope="session")
def effect(norm, learner, size, device, baseline):
    """The learner's norm measured separately at the model's norm shape and inside the training step."""
    config = dataclasses.asdict(size.config)
    batches = tokens(config, size.batch, device=device, seed=3)
    reference = GPTTrainer(size.config, None, **trainer_options(size, device))
    yours_args = (in_worker(gpt.GPTConfig, **config), norm.rms_norm)
    yours = learner.build(probes.GPTTrainer, *yours_args, **trainer_options(size, device))
    idx, targets = build_inputs(batches)(10**7)  # a batch no timed step uses
    expected, got = reference.loss(idx, targets), yours.loss(idx, targets)
    bound = 1e-4 if size.dtype == torch.float32 else 2e-2
    if not isinstance(got, float) or not abs(got - expected) <= bound * abs(expected):
        shown = f"{got:.6g}" if isinstance(got, float) else repr(got)[:60]
        raise LabCheckFailed(f"the course GPT's loss with your rms_norm is {shown}, with its own norm {expected:.6g} "
                             f"({dtype_name(size.dtype)}, {size.describe()}): plugging the operator in must not change "
                             "the model. Check rms_norm on 3-D (batch, seq, hidden) inputs with the model's weight")
    counted = yours.call((idx, targets), watch={"poison": False})
    step_counts = hotspot.counts_of(CallRecord.from_evidence(counted.record))

    def check(loss, args):
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not torch.isfinite(loss).all():
            raise LabCheckFailed("a timed training step with your rms_norm did not give a finite loss")

    if on_cpu(device):
        trainer = in_worker(GPTTrainer, *yours_args, **trainer_options(size, device))
        control = hotspot.Repeat(reference, hotspot.calls_per_round(baseline.step_s))
        step_s, baseline_s = worker_race(learner, trainer, (idx, targets), check, control)
    else:  # each side in two windows, the faster kept: a burst of other work in one window does not decide
        step_s = min(seconds(timed(yours, batches, check=check, label="a training step of the course GPT with "
                                   "your norm", calls=16)) for _ in range(2))
        baseline_s = min(baseline.step_s, seconds(reference_time(reference, batches)))
    mine, unfused = operator_race(norm, learner, *size.norm_shape, size.dtype, device, seed=4)
    return Effect(step_s=step_s, baseline_step_s=baseline_s, norm_s=mine, unfused_norm_s=unfused,
                  operator_speedup=unfused / mine, end_to_end=baseline_s / step_s, step=step_counts)
