"""The one timing harness: graders, calibration and learners all time code through `measure`.

Rules (anchors: triton.testing.do_bench, the GPU MODE eval harness, KernelBench):
- warm-up calls are excluded; the statistic is the median, with p10/p90 beside it;
- every timed call gets fresh arguments, made outside the timed region, so no output can be cached by
  input identity or content; `check` verifies a random sample of the timed outputs, drawn before each call so
  a function cannot tell a checked call from an unchecked one, against a private copy of its arguments (a
  call that changes its arguments fails);
- on a GPU each call is bracketed by CUDA events after an L2 flush, and a batch of calls is timed again
  with a device-wide synchronise and the host clock, less what an empty batch costs the same way: work
  hidden on another stream shows up there. The reported time is the larger of the two, and `escaped` says
  the event time missed most of the work;
- the device is held busy (a spin kernel) while calls are enqueued, so both clocks measure device time and
  not the host's launch overhead, which would otherwise penalise Python-launched kernels by tens of us.
"""
from __future__ import annotations

import gc
import random
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from infracourse.observe import require_inputs_unchanged, snapshot_inputs

DEFAULT_L2_FLUSH_BYTES = 256 * 2**20
HOLD_S = 300e-6        # the device is held at least this long before a clocked batch, so launches queue
MAX_HOLD_S = 0.2       # ... and at most this long: a call the host takes ~0.7 ms to launch (a norm's forward +
                       # backward through autograd) still gets a batch of 48 calls, whose fixed costs then
                       # weigh 3x less per call than in the 16 that a 50 ms hold allowed
MAX_HOST_S = 25e-3     # a host launch time is taken as at most this per call
HOLD_FACTOR = 4        # the hold covers this many times the host's launch time of the batch: the figure is a
                       # quiet call's, and a 512^3 matmul still read as 'escaped' at 2x on the H200
ESCAPE_SLACK_S = 20e-6   # a call's device-wide time may exceed twice its events' time by this much ...
BATCH_FIXED_S = 1.5e-3   # ... or by this over the batch: how much a batch's own costs (waking the worker,
                         # launching the hold, the reply) vary from batch to batch: 0.7-1.7 ms through the
                         # worker on the H200, of which the quicker of two empty batches is taken off the clock
MAX_OVERHEAD_CREDIT_S = 2e-3  # at most this much of a batch's own costs, measured by an empty batch, is taken
                              # off its clock (the judge's worker is untrusted: a slow empty batch buys no more)


def clocked_batch(prepared: int, host_s: float) -> tuple[int, float]:
    """(calls, hold in seconds) of a batch timed by the device-wide clock: the device is held HOLD_FACTOR times
    the host's launch time of the calls, within MAX_HOLD_S, so fewer calls are clocked when one call takes the
    host long to enqueue (a training step) than when it is a single kernel launch. The judge's clock of a
    worker's batch (grading.perf) and `measure`'s own batch follow this one rule, so both sides of a
    comparison are timed alike."""
    host = min(max(host_s, 0.0), MAX_HOST_S)
    calls = prepared if host <= 0 else max(2, min(prepared, int((MAX_HOLD_S - HOLD_S) / (HOLD_FACTOR * host))))
    return calls, min(HOLD_S + HOLD_FACTOR * calls * host, MAX_HOLD_S)


def rehold(hold_s: float, enqueued_s: float, held_s: float | None = None) -> float | None:
    """A longer hold for another clocked batch when the host took longer to enqueue the batch than the device
    was held (the device ran dry, so the batch was timed at the host's pace: a stall of the host, not the work);
    None when the hold covered the launches or is already the longest. `held_s`, the hold's own time on the
    device where known, counts when it fell short of what was asked. Each new hold is at least twice the last,
    so a batch is clocked a few times at most. Only a hold follows from what the batch reports: the time
    graded is still the device's, measured after the hold."""
    covered = hold_s if held_s is None else min(hold_s, held_s)
    if enqueued_s <= covered or hold_s >= MAX_HOLD_S:
        return None
    return min(max(HOLD_S + 2 * enqueued_s, 2 * hold_s), MAX_HOLD_S)


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for a timed region, as timeit does. A collection that happens to
    fall inside a clocked batch stalls the host for milliseconds: the device runs dry once its hold is spent,
    and a batch of a few milliseconds is timed at the pace of that pause, not of the work."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    samples_s: list[float] = field(repr=False)
    wall_per_call_s: float | None = None  # device-synchronised host clock over a batch (GPU only)
    device: str = "cpu"
    wall_calls: int | None = None  # the calls of that batch

    @property
    def seconds(self) -> float:
        """The figure graders use: never less than what the device-wide clock saw."""
        return max(self.median_s, self.wall_per_call_s or 0.0)

    @property
    def escaped(self) -> bool:
        """True when most of the work ran outside the timed stream (e.g. launched on a side stream): the
        device-wide clock saw over twice what the events saw, by more than a batch's fixed costs explain. A CPU
        has no streams: there the clock around a batch also counts the worker's per-call loop, and is no
        evidence. Work below that slack is no gain to hide: `seconds` takes the device-wide clock whenever it
        saw more."""
        wall = self.wall_per_call_s
        slack = max(ESCAPE_SLACK_S, BATCH_FIXED_S / self.wall_calls if self.wall_calls else 0.0)
        return self.device != "cpu" and wall is not None and wall > 2 * self.median_s and wall - self.median_s > slack

    def as_dict(self) -> dict:
        return {"median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s, "n": len(self.samples_s),
                "wall_per_call_s": self.wall_per_call_s, "wall_calls": self.wall_calls, "seconds": self.seconds,
                "escaped": self.escaped, "device": self.device}


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method), q in [0, 100]."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _no_args() -> tuple:
    return ()


def measure(
    fn: Callable[..., Any],
    *,
    make_args: Callable[[], tuple] = _no_args,
    check: Callable[[Any, tuple], None] | None = None,
    warmup: int = 3,
    reps: int | None = None,
    budget_s: float = 1.0,
    max_reps: int = 200,
    flush_l2: bool = True,
    device: str | None = None,
    check_fraction: float = 0.1,
    wall_clock: bool = True,
) -> Timing:
    """Time `fn(*make_args())`. `reps=None` repeats until `budget_s` of timed work or `max_reps`.

    `check(out, args)` runs (outside the timing) on the first timed output, on a random `check_fraction` of
    the others, on one random output of the wall-clock batch and on one more call outside the statistics.
    `device` defaults to 'cuda' when a GPU is present. `wall_clock=False` leaves out the device-wide batch (a
    grading worker, whose batch the judge times with its own clock instead).
    """
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = device.startswith("cuda")
    draw = random.SystemRandom()  # unpredictable from inside fn
    host_s = 0.0
    for _ in range(warmup):
        args = make_args()
        t0 = time.perf_counter()
        fn(*args)
        host_s = time.perf_counter() - t0  # host time to enqueue one call (the last warm-up's, compiled by then)
    if on_gpu:
        torch.cuda.synchronize()
        flush = torch.empty(_l2_flush_bytes() // 4, dtype=torch.float32, device=device) if flush_l2 else None

    samples: list[float] = []
    spent = 0.0
    target = reps if reps is not None else max_reps
    gc.collect()  # what the warm-up left, collected before the clock runs (collections are paused while it does)
    with gc_paused():
        while len(samples) < target and (reps is not None or spent < budget_s or len(samples) < 5):
            args = make_args()
            checked = check is not None and (not samples or draw.random() < check_fraction)
            snapshot = _snapshot(args) if checked else None
            if on_gpu:
                if flush is not None:
                    flush.zero_()
                hold_device(2 * host_s + 20e-6)  # the launch is queued before the start event fires
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn(*args)
                end.record()
                torch.cuda.synchronize()  # device-wide: whatever fn queued anywhere has finished
                elapsed = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                out = fn(*args)
                elapsed = time.perf_counter() - t0
            samples.append(elapsed)
            spent += elapsed
            if checked:
                verify_call(check, out, args, snapshot)
            del out
    if check is not None:
        args = make_args()
        snapshot = _snapshot(args)
        verify_call(check, fn(*args), args, snapshot)  # one more, outside the statistics

    wall, calls = wall_per_call(fn, make_args, check, draw, host_s=host_s) if on_gpu and wall_clock else (None, None)
    return Timing(median_s=statistics.median(samples), p10_s=percentile(samples, 10),
                  p90_s=percentile(samples, 90), samples_s=samples, wall_per_call_s=wall, device=device,
                  wall_calls=calls)


def _snapshot(args: tuple) -> list:
    return snapshot_inputs(args)


def verify_call(check: Callable[[Any, tuple], None], out: Any, args: tuple, snapshot: list) -> None:
    """The call must have left its arguments unchanged; `check` then judges the output on the private copy."""
    require_inputs_unchanged(args, snapshot, "the timed function")
    check(out, tuple(arg if copy is None else copy for arg, copy in zip(args, snapshot)))


def wall_per_call(fn: Callable[..., Any], make_args: Callable[[], tuple],
                   check: Callable[[Any, tuple], None] | None = None, draw: random.Random | None = None,
                   calls: int = 8, host_s: float = 0.0) -> tuple[float, int]:
    """Host clock around a batch of calls, bracketed by device-wide synchronisation, per call, and the calls
    clocked; one random output of the batch is checked afterwards, so the batch cannot be skipped either."""
    import torch

    first = make_args()
    size = sum(a.nbytes for a in first if isinstance(a, torch.Tensor)) or 1
    free, _ = torch.cuda.mem_get_info()
    # fresh inputs for each call, within memory; no more calls than the hold covers (a slow-to-launch call such
    # as a training step is clocked fewer times, or the batch would run at the host's pace once the hold ends)
    calls, hold = clocked_batch(max(2, min(calls, int(0.25 * free // size))), host_s)
    batch = [first] + [make_args() for _ in range(calls - 1)]
    pick = (draw or random.SystemRandom()).randrange(calls)
    snapshot = _snapshot(batch[pick]) if check is not None else None
    kept = None
    for args in batch:  # untimed pass: the allocator holds a batch's worth of outputs before the clock runs
        fn(*args)
    torch.cuda.synchronize()
    while hold is not None:
        gc.collect()
        with gc_paused():
            fixed = batch_overhead(hold)
            t0 = time.perf_counter()
            held = hold_device(hold)  # the whole batch is queued while the device waits
            for i, args in enumerate(batch):
                out = fn(*args)
                if i == pick:
                    kept = out
                del out
            enqueued = time.perf_counter() - t0
            torch.cuda.synchronize()
            held_s = held.seconds()
            wall = max(time.perf_counter() - t0 - held_s - fixed, 0.0) / calls
        hold = rehold(hold, enqueued, held_s)
    if check is not None:
        verify_call(check, kept, batch[pick], snapshot)
    return wall, calls


def batch_overhead(hold_s: float, clock_empty_batch: Callable[[float], float] | None = None) -> float:
    """What a device-wide clock of a batch costs besides its calls: the quicker of two empty batches under the
    same hold, the hold's own time taken off (launching the hold, the synchronise and, through a grading
    worker, the channel both ways and waking each side: ~0.2 ms in process, ~1 ms through the worker on the
    H200, which over a batch of 20 calls is 50 us a call). `clock_empty_batch(hold_s)` -> seconds besides
    the hold; by default in this process. At most MAX_OVERHEAD_CREDIT_S."""
    if clock_empty_batch is None:
        clock_empty_batch = _empty_batch
    return min(clock_empty_batch(hold_s), clock_empty_batch(hold_s), MAX_OVERHEAD_CREDIT_S)


def _empty_batch(hold_s: float) -> float:
    import torch

    t0 = time.perf_counter()
    held = hold_device(hold_s)
    torch.cuda.synchronize()
    return max(time.perf_counter() - t0 - held.seconds(), 0.0)


class DeviceHold:
    def __init__(self, start=None, end=None, cycles: int = 0):
        self.start, self.end, self.cycles = start, end, cycles

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3 if self.start is not None else 0.0


_cycles_per_s: float | None = None
_last_hold: DeviceHold | None = None
SPIN_CALIBRATION = (1_000_000, 10_000_000)  # spin cycles of the two calibration runs (~0.5 and ~5 ms)


def _spin_rate(sleep) -> float:
    """Cycles per second of the spin kernel, from the difference of two timed spins after a warm-up launch: the
    first launch's loading of the kernel and the gap before a launch reaches the device cancel out (timed
    alone, they made holds 1.3x to 35x shorter than asked on the H200)."""
    import torch

    sleep(1000)
    torch.cuda.synchronize()
    spans = []
    for cycles in SPIN_CALIBRATION:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        sleep(cycles)
        b.record()
        b.synchronize()
        spans.append(a.elapsed_time(b) / 1e3)
    return (SPIN_CALIBRATION[1] - SPIN_CALIBRATION[0]) / max(spans[1] - spans[0], 1e-6)


def hold_device(seconds: float) -> DeviceHold:
    """Keep the current stream busy for about `seconds` (torch.cuda._sleep), so that calls enqueued meanwhile
    start back to back: the time measured is the device's, not the host's launch overhead. The hold itself is
    bracketed by events so a host-clock measurement can subtract it exactly. The spin's rate follows the
    device's clock: each finished hold of 100 us or more re-measures it."""
    import torch

    global _cycles_per_s, _last_hold
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None or seconds <= 0:
        return DeviceHold()
    if _cycles_per_s is None:
        _cycles_per_s = _spin_rate(sleep)
    last = _last_hold
    spun = last.seconds() if last is not None and last.end.query() else 0.0
    if spun >= 100e-6:
        rate = last.cycles / spun  # within 2x: a host stall between a start event and its spin is no rate
        _cycles_per_s = min(max(rate, _cycles_per_s / 2), 2 * _cycles_per_s)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = int(min(seconds, MAX_HOLD_S) * _cycles_per_s)
    start.record()
    sleep(cycles)
    end.record()
    _last_hold = DeviceHold(start, end, cycles)
    return _last_hold


def _l2_flush_bytes() -> int:
    import torch

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0
    return max(DEFAULT_L2_FLUSH_BYTES, 4 * l2)
