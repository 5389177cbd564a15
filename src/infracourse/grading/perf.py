"""Performance checks for kernel labs: time a learner's function in the worker, but trust the judge's clock;
reject impossible or escaped timings; compare the achieved rate with a fraction of this device's calibrated
ceiling (or a library's time, measured here in the judge, which learner code never touched).

The worker times its calls with CUDA events (bench.measure), which learner code in the worker could fake.
So the judge also times a batch of calls with its own clock, from the request to the answer that follows
the worker's device-wide synchronise. The batch's inputs do not exist before that clock starts: the worker
draws them from a salt the request carries, inside the clock, so no output can be computed ahead of it. Off the
clock come what an empty batch costs the same way (bench.batch_overhead) and the inputs' draw as the judge
times it itself; outputs of the batch picked after it ran are checked, and the larger of the two times is
graded, never below the physics floor of this device.
"""
from __future__ import annotations

import gc
import itertools
import math
import random
import statistics
import time
from typing import Any, Callable

import torch

from infracourse import bench
from infracourse.bench import HOLD_FACTOR, HOLD_S, MAX_HOLD_S, MAX_HOST_S, clocked_batch  # noqa: F401 (one rule)
from infracourse.failures import LabCheckFailed
from infracourse.grading.inputs import SALTS, build, salted
from infracourse.grading.protocol import Op, BuildInWorker
from infracourse.grading.provenance import require_clean_sources
from infracourse.grading.remote import RemoteObject
from infracourse.grading.verdicts import require_own_kernel, require_possible


def _timing_primitives() -> dict[str, Any]:
    """What a timing's honesty rests on, by identity."""
    event = torch.cuda.Event
    return {
        "time.perf_counter": time.perf_counter, "statistics.median": statistics.median,
        "bench.measure": bench.measure, "bench.wall_per_call": bench.wall_per_call, "bench.verify_call": bench.verify_call,
        "bench.batch_overhead": bench.batch_overhead,
        "bench.Timing.seconds": bench.Timing.__dict__["seconds"],
        "bench.Timing.escaped": bench.Timing.__dict__["escaped"],
        "torch.cuda.is_available": torch.cuda.is_available, "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event": event, "Event.record": event.record, "Event.elapsed_time": event.elapsed_time,
        "Event.__init__": event.__init__, "Event.__new__": event.__new__,
    }


_GENUINE = _timing_primitives()


def require_genuine_timing() -> None:
    """Fail when code imported since this module was loaded replaced a timing primitive."""
    replaced = [name for name, obj in _timing_primitives().items() if obj is not _GENUINE[name]]
    if replaced:
        raise LabCheckFailed(f"{', '.join(replaced)} changed after the grader loaded: your code replaced the clock "
                             "or the harness that times it. Remove that; timings are only taken with the originals.")


BATCH_CALLS = 48


def timed(fn: Callable[..., Any], make_args, *, check: Callable[[Any, tuple], None],
          bytes_moved: float = 0, flops: float = 0, ceilings=None, label: str = "your kernel",
          require_kernel: bool = False, calls: int = BATCH_CALLS, budget_s: float | None = None) -> bench.Timing:
    """Time fn on fresh inputs, verifying outputs of timed calls; fail when the timing cannot be trusted.

    `fn` is a learner function (a grading.remote.RemoteObject); `make_args` is a `BuildInWorker` naming a course
    input generator `gen(index) -> args` (grading.inputs): the worker and the judge build the same inputs
    from it, so the judge checks the worker's outputs against its own copy of each call's inputs.
    `require_kernel` (a learner's kernel timed directly) also fails timed calls that launched no Triton kernel
    or did not pass their inputs and output through one, as the worker recorded them. `calls` bounds the
    judge-clocked batch (fewer for a call that is itself long, such as several training steps); `budget_s` the
    worker's event-timed samples (bench.measure's budget, 1 s by default: less where a check times many
    configurations and the judge's clocked batch is the figure graded)."""
    if not isinstance(fn, RemoteObject):
        raise TypeError(f"timed times a learner function in the grading worker, not {type(fn).__name__}: pass an "
                        "object of the `learner` fixture (a library op is timed with reference_time)")
    timing = _timed_in_worker(fn, make_args, check, label, require_kernel, calls, budget_s)
    if timing.escaped:
        raise LabCheckFailed(
            f"{label}: CUDA events saw {timing.median_s * 1e6:.1f} us per call but the device-wide clock saw "
            f"{timing.wall_per_call_s * 1e6:.1f} us: the work ran outside the timed stream. Launch on the current "
            "stream (no side streams or threads) so the time measured is the time the work takes.")
    if ceilings is not None:
        peak = max(ceilings.matmul_tflops.values(), default=None) if flops else None
        require_possible(timing.seconds, bytes_moved=bytes_moved, flops=flops, copy_gbps=ceilings.copy_gbps,
                         peak_tflops=peak)
    return timing


def _timed_in_worker(fn, make_args, check: Callable[[Any, tuple], None], label: str,
                     require_kernel: bool, batch_calls: int, budget_s: float | None = None) -> bench.Timing:
    worker = fn._worker
    generate = build(make_args)
    draw = random.SystemRandom()  # salts and picks: unpredictable from the worker, decided when they are used
    asked = max(2, min(batch_calls, BATCH_CALLS))
    values = {"make_args": make_args}
    if budget_s is not None:
        values["options"] = {"budget_s": float(budget_s)}
    prepare = worker.request(Op.TIME_PREPARE, values, target=fn._handle.id, calls=asked)
    prepared = prepare.value
    stats = _numbers(prepared, ("median_s", "p10_s", "p90_s", "calls", "host_s"), label)
    calls = int(stats["calls"])
    if not 2 <= calls <= asked:
        raise LabCheckFailed(f"{label}: the timing worker reported a batch of {calls} calls")
    drawing = input_draw_seconds(generate)
    # the clocked calls are enqueued while the device waits (as bench.measure does in one process): a call the
    # host takes longer to launch than the device to run is timed by the device, not by Python's launch overhead
    calls, hold = clocked_batch(calls, stats["host_s"])
    while hold is not None:
        # the batch's inputs are drawn from this salt inside the clock: before it, no output can be computed
        salt = draw.randrange(*SALTS)
        gc.collect()  # the judge's own collections stay out of its clock, as the worker's do (bench.gc_paused)
        with bench.gc_paused():
            fixed = _batch_overhead(worker, hold, label)
            t0 = time.perf_counter()
            run = worker.request(Op.TIME_RUN, hold_s=hold, calls=calls, salt=salt)
            wall = time.perf_counter() - t0
        ran = _numbers(run.value, ("calls", "hold_s", "enqueue_s"), label)
        if ran["calls"] != calls:
            raise LabCheckFailed(f"{label}: the timing worker ran another number of calls than the {calls} asked for")
        wall_per_call = max(wall - _hold_credit(ran, hold) - fixed - calls * drawing, 0.0) / calls
        # a batch the host enqueued slower than the device was held ran at the host's pace: once more, held longer
        # (what the worker reports sets only the next hold, at least twice this one, whose credit stays capped by
        # what the judge asked for)
        hold = bench.rehold(hold, ran["enqueue_s"], ran["hold_s"]) if worker.gpu else None
    picks = sorted({calls - 1, draw.randrange(calls), draw.randrange(calls)})  # decided only now, after the batch
    picked = worker.request(Op.TIME_OUTPUTS, indices=picks)  # after the clock: the launch records are read here
    outputs = picked.value
    if not isinstance(outputs, list) or len(outputs) != len(picks):
        raise LabCheckFailed(f"{label}: the timing worker did not return the outputs of the timed calls")
    for index, out in zip(picks, outputs):
        check(out, generate(salted(salt, index)))
    # what the worker recorded is corroborated by the judge's own reading of the learner's files: code that could
    # rewrite the worker's records or its reply to this clock fails here, whatever those records say
    if require_kernel:
        _require_kernels(label, prepare.record, picked.record)
        require_own_kernel(fn)
    else:
        require_clean_sources(worker.learner_dir, native_code=worker.native_code)
    # the device the worker timed on is the one it was given, which the judge knows (not what the worker says)
    return bench.Timing(median_s=stats["median_s"], p10_s=stats["p10_s"], p90_s=stats["p90_s"], samples_s=[],
                        wall_per_call_s=wall_per_call, device="cuda" if worker.gpu else "cpu", wall_calls=calls)


def input_draw_seconds(generate: Callable[[int], tuple]) -> float:
    """What drawing one call's inputs costs, timed here in the judge (which learner code never touches) by the
    same harness as everything else: the clocked batch draws its inputs inside the judge's clock, so this much
    per call comes off it. Indices far from any batch's, as reference_time's are."""
    indices = itertools.count(10**7)
    return bench.measure(generate, make_args=lambda: (next(indices),), warmup=2, reps=15, flush_l2=False,
                         device=getattr(generate, "device", None), wall_clock=False).median_s


def _require_kernels(label: str, *records: dict) -> None:
    """Every call of the watched warm-up pass and of the clocked batch launched a kernel given its inputs and
    its output (the worker's records): code that computes another way when it is not watched shows here."""
    problems = {"calls_without_kernel": "launched no Triton kernel",
                "calls_without_data_flow": "did not pass its inputs and its output through your kernel"}
    for record in records:
        for key, what in problems.items():
            count = record.get(key) if isinstance(record, dict) else None
            if not isinstance(count, int) or isinstance(count, bool) or count:
                raise LabCheckFailed(
                    f"{label}: {count if isinstance(count, int) else 'some'} timed call(s) {what}. Timed calls "
                    "must do the work the graded calls do: no cached results, no torch or host computation in "
                    "place of your kernel.")


def _hold_credit(ran: dict, hold: float) -> float:
    """The hold a worker reports it waited, taken off the judge's clock up to a little over what was asked."""
    return min(max(ran["hold_s"], 0.0), 1.1 * hold + 50e-6)


def _batch_overhead(worker, hold: float, label: str) -> float:
    """bench.batch_overhead through the worker: its empty batch (time_idle) clocked as time_run is."""
    def empty_batch(hold_s: float) -> float:
        t0 = time.perf_counter()
        idle = worker.request(Op.TIME_IDLE, hold_s=hold_s)
        wall = time.perf_counter() - t0
        return max(wall - _hold_credit(_numbers(idle.value, ("hold_s",), label), hold_s), 0.0)

    return bench.batch_overhead(hold, empty_batch)


def _numbers(reply: Any, keys: tuple[str, ...], label: str) -> dict[str, float]:
    """Numbers the worker reported, type-checked (it is untrusted): finite and non-negative."""
    if not isinstance(reply, dict) or not all(isinstance(reply.get(k), (int, float)) and
                                              math.isfinite(reply[k]) and reply[k] >= 0 for k in keys):
        raise LabCheckFailed(f"{label}: the timing worker sent malformed figures ({str(reply)[:200]})")
    return {k: float(reply[k]) for k in keys}


def reference_time(fn: Callable[..., Any], make_args) -> bench.Timing:
    """Time the library op a lab compares with (torch.softmax, cuBLAS, ...) here, through the same harness.

    `make_args` is a callable () -> args, or the input-generator spec the learner's timing used: the
    reference then runs on fresh inputs of the same kind, drawn here (indices the timed batch never uses)."""

    if isinstance(make_args, BuildInWorker):
        generate, indices = build(make_args), itertools.count(10**6)
        make_args = lambda: generate(next(indices))  # noqa: E731
    require_genuine_timing()
    return bench.measure(fn, make_args=make_args)


def require_fraction(achieved: float, ceiling: float, fraction: float, *, unit: str, what: str, record,
                     name: str, **extra) -> None:
    """Record `achieved` against `fraction` x `ceiling` and fail below it. `extra` is stored with the figure
    (bytes=, flops=, seconds=, reference_seconds=, reference=: what the grade's plots draw)."""
    target = fraction * ceiling
    record(name, achieved, target=target, unit=unit, ceiling=ceiling, fraction_of_ceiling=achieved / ceiling,
           **extra)
    if achieved < target:
        raise LabCheckFailed(f"{what}: {achieved:.1f} {unit} is {achieved / ceiling:.0%} of this device's "
                             f"{ceiling:.1f} {unit}; the target is {fraction:.0%} ({target:.1f} {unit})")


def require_speedup(seconds: float, reference_seconds: float, threshold: float, *, reference: str, what: str,
                    record, name: str, **extra) -> None:
    """Record the speed-up over a reference (its time / yours) and fail below `threshold` x."""
    speedup = reference_seconds / seconds
    record(name, speedup, target=threshold, unit="x", seconds=seconds, reference_seconds=reference_seconds,
           reference=reference, **extra)
    if speedup < threshold:
        raise LabCheckFailed(f"{what}: {seconds * 1e6:.1f} us against {reference}'s {reference_seconds * 1e6:.1f} us "
                             f"is {speedup:.2f}x; the target is {threshold:.2f}x")
