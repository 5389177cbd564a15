"""Week 6 profile: the learner's train_step keeps the provided step's results, without its host-device
synchronisation and its extra copy, as seen in torch.profiler; on a GPU it must also be faster."""
import copy

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from infracourse import bench
from infracourse.compare import assert_close
from infracourse.guard import LabCheckFailed
from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch
from infracourse.kit.train import mean_loss, slow_train_step

PROFILE_CONFIG = GPTConfig(d_model=128, n_layer=2)
SYNC_OP = "aten::_local_scalar_dense"  # what .item(), float(t) and bool(t) run: the host waits for the value
COPY_SLACK = 0.05  # of the gradient bytes: clipping's per-tensor norms and the metrics are small


@pytest.fixture(scope="module")
def step(learner):
    return learner.module("step").train_step


def _setup(cfg, device, seed, batch=8, count=3):
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [synthetic_batch(cfg, batch, seed=seed + i, device=device) for i in range(count)]
    return model, optimizer, batches


@pytest.mark.check("step-correct")
def test_step_correct(step, device, seed):
    model, optimizer, batches = _setup(PROFILE_CONFIG, device, seed)
    reference = copy.deepcopy(model)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    mine, ref = {}, {}
    for inputs, targets in batches:  # the first steps' gradients have norms above 1: clipping is exercised
        step(model, optimizer, inputs, targets, mine)
        slow_train_step(reference, ref_optimizer, inputs, targets, ref)
    if mine.get("steps") != len(batches):
        raise LabCheckFailed(f"metrics['steps'] is {mine.get('steps')} after {len(batches)} steps")
    got, want = mean_loss(mine), mean_loss(ref)
    if abs(got - want) > 1e-6 * abs(want):
        raise LabCheckFailed(f"mean_loss(metrics) is {got!r} after your steps, {want!r} after the provided step's "
                             "(metrics['loss_sum'] must add up every step's loss)")
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close(p, q, rtol=1e-4, atol=1e-6, what=f"{name} after {len(batches)} steps (seed {seed}); "
                     f"the provided step clips the global gradient norm to 1.0 before AdamW")


def _profile(fn, device) -> dict:
    """Per profiled call: calls of the sync op, and bytes each op allocated (self, CPU plus device)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        fn()
    allocated, syncs = {}, 0
    for event in prof.events():
        syncs += event.name == SYNC_OP
        grown = max(event.self_cpu_memory_usage, 0) + max(getattr(event, "self_device_memory_usage", 0), 0)
        allocated[event.name] = allocated.get(event.name, 0) + grown
    return {"syncs": syncs, "allocated": allocated}


@pytest.fixture(scope="module")
def profiles(step, device, seed):
    """The learner's step, and the floor: forward, backward and optimizer step alone, on the same model."""
    model, optimizer, batches = _setup(PROFILE_CONFIG, device, seed, count=2)
    metrics = {}
    step(model, optimizer, *batches[0], metrics)  # warm-up: Adam's states are created on the first step
    mine = _profile(lambda: step(model, optimizer, *batches[1], metrics), device)

    def bare():
        model(*batches[1])[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    floor = _profile(bare, device)
    grad_bytes = sum(p.nbytes for p in model.parameters())
    return mine, floor, grad_bytes


@pytest.mark.check("profile-no-sync")
def test_no_sync(profiles, record):
    mine, floor, _ = profiles
    record("host reads per step", mine["syncs"], target=floor["syncs"])
    if mine["syncs"] > floor["syncs"]:
        raise LabCheckFailed(
            f"the profile of one step shows {mine['syncs']} calls of {SYNC_OP}; forward, backward and "
            f"optimizer.step() alone make {floor['syncs']} (AdamW reading its step counters). Each extra one is a "
            ".item(), float() or if-test on a tensor: the host stops until the device has computed it. Keep "
            "running sums on the device and read them when they are reported.")


@pytest.mark.check("profile-no-copy")
def test_no_copy(profiles, record):
    mine, floor, grad_bytes = profiles
    extra = sum(mine["allocated"].values()) - sum(floor["allocated"].values())
    record("bytes allocated per step beyond forward+backward+optimizer", extra, target=COPY_SLACK * grad_bytes,
           unit="B")
    if extra > COPY_SLACK * grad_bytes:
        excess = {op: n - floor["allocated"].get(op, 0) for op, n in mine["allocated"].items()}
        op, most = max(excess.items(), key=lambda kv: kv[1])
        raise LabCheckFailed(
            f"one step allocates {extra:,} bytes more than forward, backward and optimizer.step() alone "
            f"({extra / grad_bytes:.0%} of the {grad_bytes:,} gradient bytes; clipping and metrics need under "
            f"{COPY_SLACK:.0%}). Most of it is {op} ({most:,} bytes): a copy of data the step already has. "
            "torch.profiler with profile_memory=True shows it; work on the tensors in place or per tensor.")


@pytest.mark.check("step-faster")
def test_step_faster(step, seed, record, lab_check):
    # a model whose device time per step a little exceeds the host's launch time: a step that makes the host
    # wait for the device then exposes all the launch work after the wait (clipping, the optimizer)
    cfg, steps_per_call = GPTConfig(d_model=384, n_head=6, n_layer=4, seq_len=128), 8

    def time_step(train_step):
        model, optimizer, _ = _setup(cfg, "cuda", seed, count=0)
        metrics = {}

        def make_args():
            return ([synthetic_batch(cfg, 16, seed=seed + i, device="cuda") for i in range(steps_per_call)],)

        def run(batches):
            for inputs, targets in batches:
                train_step(model, optimizer, inputs, targets, metrics)

        return bench.measure(run, make_args=make_args, warmup=3, budget_s=2.0).seconds

    provided, yours = time_step(slow_train_step), time_step(step)
    record("provided step", provided / steps_per_call, unit="s")
    record("your step", yours / steps_per_call, target=lab_check.threshold * provided / steps_per_call, unit="s")
    if yours > lab_check.threshold * provided:
        raise LabCheckFailed(f"{steps_per_call} of your steps take {yours * 1e3:.2f} ms, the provided step's "
                             f"{provided * 1e3:.2f} ms: not {1 - lab_check.threshold:.0%} faster. Without the "
                             "synchronisation the host queues the next kernels while the device still computes.")
