"""Week 1 harness: workloads of known behaviour show whether warm-up, timing scope, synchronisation and
the statistics are right. Each workload records how long every call really took (infracourse.kit.workloads).

The learner's harness runs in the grading worker; the CPU workloads stay here in the grader and are called
back from there, so their truth is measured by the grader, and every call the harness times includes one
callback round trip: a sample may exceed its call by `slack` (conftest). The GPU workload must run in the
worker, whose synchronize has to wait for it; its length is measured here, by the grader, on the same GPU."""
import itertools
import statistics
import time

import numpy as np
import pytest

from infracourse import bench
from infracourse.grader import LabCheckFailed, in_worker
from infracourse.kit import probes, workloads
from infracourse.kit.workloads import CudaSleep, Jittery, SlowStart, Steady, ThreadQueue

OVERHEAD_S = 1e-3  # what a harness may add to a GPU call (clock reads, the sync, Python); no round trip there


# Built in the worker: a sync that waits for nothing adds no round trip to the grader inside the timed region.
NO_SYNC = in_worker(workloads.NoWait)


def _timed(harness, fn, *, warmup, reps, sync=NO_SYNC, make_args=None):
    kwargs = {"warmup": warmup, "reps": reps}
    if sync is not None:
        kwargs["sync"] = sync
    args = (fn,) if make_args is None else (fn, make_args)
    samples = harness.time_calls(*args, **kwargs)
    if not isinstance(samples, (list, tuple)) or not all(isinstance(s, (int, float)) for s in samples):
        raise LabCheckFailed(f"time_calls returned {type(samples).__name__}: return a list of seconds, one per timed call")
    if len(samples) != reps:
        raise LabCheckFailed(f"time_calls(warmup={warmup}, reps={reps}) returned {len(samples)} samples: expected one "
                             f"per timed call ({reps}). Warm-up calls are run but never recorded.")
    return list(samples)


def _require_faithful(samples, truth, what, slack):
    """Each sample covers its own call: never shorter than the call (the call runs inside the learner's clock
    interval, so this holds exactly), and in the median at most `slack` longer (a round trip to the grader
    is in every sample, and a loaded machine delays single calls: no single sample is held to it)."""
    for i, (got, real) in enumerate(zip(samples, truth)):
        if got < real - 50e-6:
            raise LabCheckFailed(f"{what}: timed call {i} took {real * 1e3:.3f} ms (measured inside the workload) but "
                                 f"your sample says {got * 1e3:.3f} ms. Start the clock right before the call and "
                                 "stop it right after the work is done.")
    excess = statistics.median(got - real for got, real in zip(samples, truth))
    if excess > slack:
        raise LabCheckFailed(f"{what}: your samples exceed the calls they time by {excess * 1e3:.3f} ms in the median "
                             f"({slack * 1e3:.3f} ms allowed here). Start the clock right before the call and stop it "
                             "right after the work is done.")


@pytest.mark.check("warmup")
def test_warmup_excluded(harness, slack, record):
    workload = SlowStart(0.002, slow_calls=3, slow_s=0.06)  # 30 ms of margin for a delayed round trip
    samples = _timed(harness, workload, warmup=5, reps=12)
    worst = max(samples)
    record("slowest timed call", worst * 1e3, target=workload.slow_s * 1e3 / 2, unit="ms")
    if worst > workload.slow_s / 2:
        raise LabCheckFailed(
            f"a workload whose first 3 calls take 60 ms and later calls 2 ms was timed with warmup=5, but your "
            f"samples include a {worst * 1e3:.1f} ms call: the warm-up calls were timed. Run `warmup` calls first "
            "(compilation, caches and allocators settle there) and record only the `reps` calls after them.")
    if len(workload.durations) < 5 + 12:
        raise LabCheckFailed(f"time_calls(warmup=5, reps=12) called the workload {len(workload.durations)} times: "
                             "it must make the 5 warm-up calls and then 12 timed ones")
    _require_faithful(samples, workload.durations[-12:], "steady calls after warm-up", slack)


PREPARE_S = 0.03  # make_args' cost: half of it is the margin for a delayed round trip


@pytest.mark.check("timing-scope")
def test_timing_scope(harness, slack, record):
    workload, given = Steady(0.002), []
    tokens = itertools.count()

    def make_args():  # slow input preparation, like generating a large random tensor
        time.sleep(PREPARE_S)
        return (next(tokens),)

    def fn(token):
        given.append(token)
        workload()

    samples = _timed(harness, fn, warmup=2, reps=10, make_args=make_args)
    record("median sample", statistics.median(samples) * 1e3, target=2.0, unit="ms")
    if statistics.median(samples) > 0.002 + PREPARE_S / 2:
        raise LabCheckFailed(
            f"fn takes 2 ms and make_args {PREPARE_S * 1e3:.0f} ms, and your median sample is {statistics.median(samples) * 1e3:.1f} ms: "
            "preparing the inputs was timed too. Call make_args() before starting the clock: the timed region is the "
            "call, not its set-up.")
    if len(set(given)) != len(given):
        raise LabCheckFailed("fn received the same arguments twice: call make_args() for every call (warm-up included), "
                             "so no call can reuse a cached result for old inputs")
    _require_faithful(samples, workload.durations[-10:], "fn with slow make_args", slack)


QUEUED_WARMUP = 5  # warm-up jobs left queued by a harness that starts the clock without a sync first


@pytest.mark.check("sync-thread")
def test_sync_asynchronous_work(harness, slack, record):
    workload = ThreadQueue(0.03)  # the queue and its wait() run here: each pays a round trip from the worker
    samples = _timed(harness, workload, warmup=QUEUED_WARMUP, reps=8, sync=workload.wait)
    workload.wait()  # the grader's own wait: a harness that never called sync() left its jobs queued or running
    if len(workload.durations) < QUEUED_WARMUP + 8:
        raise LabCheckFailed(f"time_calls(warmup={QUEUED_WARMUP}, reps=8) called fn {len(workload.durations)} times: "
                             "call it once per warm-up and once per repetition")
    median, job = statistics.median(samples), statistics.median(workload.durations)
    record("median sample", median * 1e3, target=job * 1e3, unit="ms")
    # Every sample, not the median: each timed call's job ran inside its interval (the jobs run one after another,
    # the last 8 are the timed calls'), so no sample may be shorter than its job. A harness that waits for some
    # calls and not others, or syncs before the call instead of after it, leaves samples under that floor.
    short = [(i, got, real) for i, (got, real) in enumerate(zip(samples, workload.durations[-8:]))
             if got < real - 50e-6]
    if short:
        i, got, real = short[0]
        raise LabCheckFailed(
            f"{len(short)} of 8 samples are shorter than the job their call queued (sample {i}: {got * 1e3:.3f} ms, "
            f"its job ran {real * 1e3:.3f} ms): the clock was read before the work finished. Call sync() after "
            "fn and before reading the clock, on every repetition.")
    # One sample, not the median: only the first timed call finds the warm-up jobs still queued. Without a sync
    # before its clock starts it holds all 6 jobs (180 ms); the ceiling sits halfway, 75 ms above one job, for
    # a call delayed by a loaded machine.
    # Only the first sample is held to it: a later one delayed by other load must not fail an honest harness.
    ceiling = job * (1 + QUEUED_WARMUP / 2)
    if samples[0] > ceiling:
        raise LabCheckFailed(
            f"sample 0 took {samples[0] * 1e3:.1f} ms, and its call queued one {job * 1e3:.1f} ms job (at most "
            f"{ceiling * 1e3:.0f} ms allowed): the {QUEUED_WARMUP} warm-up calls' jobs were still running when its "
            "clock started. Call sync() before starting the clock (once after the warm-up calls at least), so "
            "work queued earlier finishes outside the timed region.")
    if median < 0.5 * job:
        raise LabCheckFailed(
            f"each call queues a {job * 1e3:.1f} ms job on a worker thread and returns at once; your harness measured "
            f"{median * 1e6:.0f} us, the time to queue it. Call sync() after fn and before reading the clock (here "
            "sync waits for the worker, on a GPU it is torch.cuda.synchronize()), and once before starting it.")
    if median > job + 2 * slack:  # two round trips: the call and sync()
        raise LabCheckFailed(f"each job takes {job * 1e3:.1f} ms but your median is {median * 1e3:.1f} ms: earlier "
                             "jobs (warm-up) finished inside the timed region. Call sync() before starting the clock.")


@pytest.mark.check("sync-cuda")
def test_sync_cuda(harness, record):
    cycles = 10_000_000  # about 5 ms on a 2 GHz GPU; the reference time is measured below
    # Measured here, in the grader's own process on the same GPU: the worker's account is never the truth.
    reference = bench.measure(CudaSleep(cycles), warmup=2, reps=10, flush_l2=False, device="cuda").seconds
    # The kernel is launched in the worker, where the harness's default sync (torch.cuda.synchronize) must wait
    # for it; a callback would launch it in this process, which the worker's sync cannot see.
    kernel = in_worker(CudaSleep, cycles)
    samples = _timed(harness, kernel, warmup=2, reps=10, sync=None)
    median = statistics.median(samples)
    record("median sample", median * 1e3, target=reference * 1e3, unit="ms")
    if min(samples) < 0.7 * reference:  # every sample holds one whole kernel: none may be far shorter
        raise LabCheckFailed(
            f"a kernel that runs {reference * 1e3:.2f} ms measured {min(samples) * 1e6:.0f} us in its shortest sample: "
            "the clock was read before the GPU finished on some repetitions. Call the default sync "
            "(torch.cuda.synchronize) after fn inside the timed region on every repetition.")
    if median < 0.7 * reference:
        raise LabCheckFailed(
            f"a kernel that runs {reference * 1e3:.2f} ms measured {median * 1e6:.0f} us: the clock was read when the "
            "launch returned, before the GPU finished. time_calls' default sync must be torch.cuda.synchronize "
            "when a GPU is present, called after fn inside the timed region.")
    if median > 1.5 * reference + OVERHEAD_S:
        raise LabCheckFailed(f"a kernel that runs {reference * 1e3:.2f} ms measured {median * 1e3:.2f} ms: something "
                             "besides the kernel is inside the timed region")


@pytest.mark.check("percentiles")
def test_percentiles(harness, learner, seed, slack, record):
    rng = np.random.default_rng(seed)
    _require_list_kept(learner, harness, rng.lognormal(-6, 0.8, size=20).tolist())
    for n in (2, 7, 20, 101):
        data = rng.lognormal(-6, 0.8, size=n).tolist()  # timing-like: positive, skewed
        original = list(data)
        for q in (0, 25, 50, 95, 99, 100):
            got, want = harness.percentile(data, q), float(np.percentile(original, q))
            if not got == pytest.approx(want, rel=1e-9):
                raise LabCheckFailed(
                    f"percentile of {n} samples at q={q}: {got!r}, expected {want!r} (seed {seed}). Use linear "
                    "interpolation: rank = (n - 1) * q / 100, then interpolate between the samples either side of "
                    "that rank (numpy's default). Nearest-rank rounds to one sample and misses it.")
        _require_summary(harness.summarize(data), original, f"summarize of {n} samples (seed {seed})", rel=1e-9)

    workload = Jittery(0.002, seed=seed)
    samples = _timed(harness, workload, warmup=3, reps=40)
    _require_faithful(samples, workload.durations[-40:], "a jittery workload", slack)
    # The tail of the samples carries the round trips' own jitter, so the summary is held to the samples it
    # summarises (exactly), and the samples to the calls they time (above).
    summary = harness.summarize(samples)
    _require_summary(summary, samples, f"summarize of a jittery workload's samples (seed {seed})", rel=1e-9)
    record("p99 of jittery calls", summary["p99"] * 1e3, unit="ms")


def _require_list_kept(learner, harness, data):
    """percentile and summarize leave the caller's list in its order. Called here, a list reaches the worker as a
    copy, so the call is made there, on a list made there (kit.probes.list_after_call)."""
    for name, args in (("percentile", (50,)), ("summarize", ())):
        after = learner.build(probes.list_after_call, getattr(harness, name), data, *args)
        if after != data:
            raise LabCheckFailed(f"{name} reordered the caller's list (a sort in place): the caller's samples keep "
                                 f"their order, e.g. the order the calls ran in. Sort a copy: sorted(samples)")


def _require_summary(summary, data, what, rel):
    if not isinstance(summary, dict):
        raise LabCheckFailed(f"{what}: summarize returned {type(summary).__name__}, expected a dict")
    want = {"n": len(data), "mean": float(np.mean(data)), "std": float(np.std(data, ddof=1)),
            **{f"p{q}": float(np.percentile(data, q)) for q in (50, 95, 99)}}
    for key, value in want.items():
        if key not in summary:
            raise LabCheckFailed(f"{what}: the summary has no {key!r} (expected keys {sorted(want)})")
        if not summary[key] == pytest.approx(value, rel=rel):
            hint = " (the sample standard deviation divides by n - 1)" if key == "std" else ""
            raise LabCheckFailed(f"{what}: {key} is {summary[key]!r}, expected {value!r}{hint}")
