"""Performance checks for kernel labs: time through bench.measure, reject impossible or escaped timings,
and compare the achieved rate with a fraction of this device's calibrated ceiling (or a library's time)."""
from __future__ import annotations

from typing import Any, Callable

from infracourse import bench
from infracourse.guard import LabCheckFailed, require_possible


def timed(fn: Callable[..., Any], make_args: Callable[[], tuple], *, check: Callable[[Any, tuple], None],
          bytes_moved: float = 0, flops: float = 0, ceilings=None, label: str = "your kernel") -> bench.Timing:
    """Time fn on fresh inputs, verifying sampled outputs; fail when the timing cannot be trusted."""
    timing = bench.measure(fn, make_args=make_args, check=check)
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


def require_fraction(achieved: float, ceiling: float, fraction: float, *, unit: str, what: str, record,
                     name: str) -> None:
    """Record `achieved` against `fraction` x `ceiling` and fail below it."""
    target = fraction * ceiling
    record(name, achieved, target=target, unit=unit, ceiling=ceiling, fraction_of_ceiling=achieved / ceiling)
    if achieved < target:
        raise LabCheckFailed(f"{what}: {achieved:.1f} {unit} is {achieved / ceiling:.0%} of this device's "
                             f"{ceiling:.1f} {unit}; the target is {fraction:.0%} ({target:.1f} {unit})")
