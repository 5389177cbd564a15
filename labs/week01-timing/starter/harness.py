"""Week 1: a benchmark harness of your own.

Write the four functions below. `infracourse grade week01` feeds them workloads of known behaviour: a
workload whose first calls are slow, one whose inputs are slow to prepare, one that only queues work on
another thread, a jittery one, and (on a GPU) a kernel of known length. Run `infracourse hint week01` if stuck.
"""
from __future__ import annotations

import time  # noqa: F401  (time.perf_counter is your clock)
from typing import Callable


def _no_args() -> tuple:
    return ()


def time_calls(fn: Callable, make_args: Callable[[], tuple] = _no_args, *, warmup: int = 3, reps: int = 20,
               sync: Callable[[], None] | None = None) -> list[float]:
    """Seconds taken by each of `reps` calls fn(*make_args()), after `warmup` calls that are not recorded.

    make_args() runs for every call, outside the timed region. sync() waits for asynchronous work; when None it
    is torch.cuda.synchronize on a machine with a GPU and a function that does nothing otherwise.
    """
    # TODO(week01): warm-up loop, then for each repetition: make the arguments, sync, start the clock
    # (time.perf_counter), call fn, sync, stop the clock, keep the difference.
    raise NotImplementedError("time_calls(): write the warm-up loop and the timed loop (see the TODO in harness.py)")


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (q from 0 to 100) by linear interpolation between the two nearest ranks."""
    # TODO(week01): sort a copy; rank = (n - 1) * q / 100; interpolate between the samples either side.
    raise NotImplementedError("percentile(): write the linear-interpolation percentile")


def summarize(samples: list[float]) -> dict:
    """A dict with n, mean, std (sample standard deviation, n - 1), p50, p95 and p99 of `samples`."""
    # TODO(week01): the statistics module has mean and stdev; use your percentile for the rest.
    raise NotImplementedError("summarize(): return n, mean, std, p50, p95 and p99")


def run_concurrent(fn: Callable[[], object], *, concurrency: int, calls: int) -> dict:
    """`calls` calls of fn() from `concurrency` threads at once.

    Returns throughput (calls per second of wall-clock time), mean_latency (seconds) and latencies (one per call).
    """
    # TODO(week01): a concurrent.futures.ThreadPoolExecutor whose tasks each time one call of fn.
    raise NotImplementedError("run_concurrent(): time each call on its own thread and the whole run on the wall clock")
