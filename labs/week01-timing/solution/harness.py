"""Week 1: a benchmark harness of your own (reference solution).

Timing scope of `time_calls`: one call of `fn` plus the wait for the work it started. Preparing the
arguments, warm-up calls and the statistics are outside the clock.
"""
from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


def _no_args() -> tuple:
    return ()


def device_sync() -> Callable[[], None]:
    """What 'wait for the device' means here: torch.cuda.synchronize with a GPU, nothing without one."""
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def time_calls(fn: Callable, make_args: Callable[[], tuple] = _no_args, *, warmup: int = 3, reps: int = 20,
               sync: Callable[[], None] | None = None) -> list[float]:
    """Seconds taken by each of `reps` calls fn(*make_args()), after `warmup` calls that are not recorded."""
    sync = sync or device_sync()
    for _ in range(warmup):
        fn(*make_args())
    samples = []
    for _ in range(reps):
        args = make_args()  # fresh inputs every call, prepared outside the timed region
        sync()  # work queued earlier (warm-up, make_args) must not finish inside this sample
        start = time.perf_counter()
        fn(*args)
        sync()  # an asynchronous call returns before its work is done: wait before reading the clock
        samples.append(time.perf_counter() - start)
    return samples


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between the two nearest ranks (numpy's default)."""
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100  # 0 is the smallest sample, n - 1 the largest
    below, above = math.floor(rank), math.ceil(rank)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)


def summarize(samples: list[float]) -> dict:
    """n, mean, sample standard deviation (n - 1) and the p50/p95/p99 percentiles of `samples`."""
    return {
        "n": len(samples),
        "mean": statistics.fmean(samples),
        "std": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "p50": percentile(samples, 50),
        "p95": percentile(samples, 95),
        "p99": percentile(samples, 99),
    }


def run_concurrent(fn: Callable[[], object], *, concurrency: int, calls: int, warmup: int | None = None) -> dict:
    """Make `calls` calls of fn from `concurrency` threads at once.

    Latency is per call, from its start to its end; throughput is calls per second of wall-clock time for
    the whole batch. The two are different quantities: never compute one from the other.
    """
    def timed_call(_):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(timed_call, range(concurrency if warmup is None else warmup)))  # starts the threads
        start = time.perf_counter()
        latencies = list(pool.map(timed_call, range(calls)))
        wall = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "calls": calls,
        "wall_s": wall,
        "throughput": calls / wall,
        "mean_latency": statistics.fmean(latencies),
        "latencies": latencies,
    }
