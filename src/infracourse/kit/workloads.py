"""Workloads of known behaviour, for testing a timing harness (week 1).

A harness is only trustworthy if it reports what really happened, so each workload here measures every
call from the inside and keeps the truth in `durations` (seconds, one per call, in call order). A
harness's samples can then be compared with the truth call by call.

- `Steady`: every call takes the same time.
- `SlowStart`: the first calls are slow, then it settles (a JIT compiling, caches and allocators warming).
- `Jittery`: every call takes a different time, drawn from a seeded long-tailed distribution.
- `ThreadQueue`: a call only enqueues work for a worker thread and returns at once; `wait()` blocks until
  the queue is empty. It behaves like a CUDA stream, where `torch.cuda.synchronize()` plays `wait()`.

Calls sleep rather than spin, so several threads can run them at once (like I/O, unlike Python bytecode).
"""
from __future__ import annotations

import queue
import random
import threading
import time


class Steady:
    """Each call sleeps `seconds`; `durations` records how long each call actually took."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.durations: list[float] = []

    def _duration(self) -> float:
        return self.seconds

    def __call__(self, *args) -> None:
        # Measured inside the call: time.sleep overshoots by tens of microseconds, and the truth must
        # include that overshoot, or a perfect harness would look wrong.
        start = time.perf_counter()
        time.sleep(self._duration())
        self.durations.append(time.perf_counter() - start)


class SlowStart(Steady):
    """The first `slow_calls` calls take `slow_s`; every later call takes `seconds`."""

    def __init__(self, seconds: float, *, slow_calls: int = 3, slow_s: float = 0.03):
        super().__init__(seconds)
        self.slow_calls, self.slow_s = slow_calls, slow_s

    def _duration(self) -> float:
        return self.slow_s if len(self.durations) < self.slow_calls else self.seconds


class Jittery(Steady):
    """Call times drawn from a lognormal distribution: median `seconds`, a long right tail, capped at 10x."""

    def __init__(self, seconds: float, *, sigma: float = 0.6, seed: int = 0):
        super().__init__(seconds)
        self.sigma = sigma
        self._rng = random.Random(seed)  # private: the harness under test may use the global RNG

    def _duration(self) -> float:
        return min(self._rng.lognormvariate(0.0, self.sigma), 10.0) * self.seconds


class ThreadQueue:
    """Asynchronous work: a call enqueues a job of `seconds` for a worker thread and returns at once.

    A harness that reads the clock right after the call measures only the enqueue (microseconds); one
    that calls `wait()` first measures the job. `durations` holds each job's own run time.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.durations: list[float] = []
        self._jobs: queue.Queue[float] = queue.Queue()
        threading.Thread(target=self._work, daemon=True, name="ThreadQueue").start()

    def _work(self) -> None:
        while True:
            seconds = self._jobs.get()
            start = time.perf_counter()
            time.sleep(seconds)
            self.durations.append(time.perf_counter() - start)
            self._jobs.task_done()

    def __call__(self, *args) -> None:
        self._jobs.put(self.seconds)

    def wait(self) -> None:
        """Block until every job queued so far has finished (the role of torch.cuda.synchronize)."""
        self._jobs.join()


class CudaSleep:
    """A GPU kernel that spins `cycles` clock cycles, launched asynchronously (torch.cuda._sleep).

    Built inside the grading worker, so the learner's torch.cuda.synchronize waits for it; its true length
    is measured separately by the grader, in its own process, on the same GPU (never reported from here).
    """

    def __init__(self, cycles: int):
        self.cycles = int(cycles)

    def __call__(self, *args) -> None:
        import torch

        torch.cuda._sleep(self.cycles)


def call_repeatedly(fn, times: int) -> int:
    """Call `fn()` `times` times (in the grading worker, `fn` being a grader's callback): the grader clocks
    the whole request to learn what one callback round trip costs on this machine right now."""
    for _ in range(times):
        fn()
    return times


class NoWait:
    """A sync for work that is finished when the call returns (on the CPU): waits for nothing."""

    def __call__(self) -> None:
        pass


def loop_sums(n: int, times: int) -> int:
    """Sum a list of n floats with a Python for-loop, `times` times (the week 1 handout's loop_sum). Run in the
    grading worker and clocked by the grader at two values of `times`: the difference is the loop's own cost in
    the interpreter that runs the learner's code, without the round trip or the list's construction."""
    values = [0.5] * n  # cheap to build: the clocked difference is the loops, not this
    for _ in range(times):
        total = 0.0
        for v in values:
            total += v
    return times


class RecordedSleep:
    """`time.sleep` that keeps each call's asked and actual seconds: built in the grading worker and handed to
    the learner's experiments as their sleeping call, so the grader knows how many sleeps really ran, and how
    long, when it reads the latencies the learner wrote. Safe to call from many threads at once."""

    def __init__(self):
        self._calls: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def __call__(self, seconds: float) -> None:
        start = time.perf_counter()
        time.sleep(seconds)
        took = time.perf_counter() - start
        with self._lock:
            self._calls.append((seconds, took))

    def take(self) -> list[tuple[float, float]]:
        """(asked, took) of each call since the last take."""
        with self._lock:
            calls, self._calls = self._calls, []
        return calls
