"""Performance checks for kernel labs: time through bench.measure, reject impossible or escaped timings,
and compare the achieved rate with a fraction of this device's calibrated ceiling (or a library's time).

The learner's module runs in the grader's process, so it could replace the clock the grade reads
(`torch.cuda.Event.elapsed_time = ...`). The timing primitives are captured when this module is imported,
which graders do before they import the learner's code, and `timed` refuses to time with replaced ones.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from infracourse import bench
from infracourse.guard import LabCheckFailed, require_possible


def _timing_primitives() -> dict[str, Any]:
    """What a timing's honesty rests on, by identity."""
    event = torch.cuda.Event
    return {
        "time.perf_counter": time.perf_counter, "statistics.median": statistics.median,
        "bench.measure": bench.measure, "bench._wall_per_call": bench._wall_per_call, "bench._verify": bench._verify,
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


def timed(fn: Callable[..., Any], make_args: Callable[[], tuple], *, check: Callable[[Any, tuple], None],
          bytes_moved: float = 0, flops: float = 0, ceilings=None, label: str = "your kernel") -> bench.Timing:
    """Time fn on fresh inputs, verifying sampled outputs; fail when the timing cannot be trusted."""
    require_genuine_timing()
    timing = bench.measure(fn, make_args=make_args, check=check)
    require_genuine_timing()  # also replaced during the timed calls?
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


def reference_time(fn: Callable[..., Any], make_args: Callable[[], tuple]) -> bench.Timing:
    """Time the library op a lab compares with (torch.softmax, cuBLAS, ...) through the same harness."""
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
