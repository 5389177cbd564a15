"""Week 1 experiments: Python's cost per element against one vectorised call, and latency, throughput and
concurrency for a call that sleeps and a call that runs Python. `python benchmark.py` writes results/."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch  # noqa: F401  (you will need it for torch.sum)

from harness import run_concurrent, summarize, time_calls  # noqa: F401

N = 100_000


def loop_sum(values: list[float]) -> float:
    """The Python loop this week measures. Keep it as it is: the grader times the same loop."""
    total = 0.0
    for v in values:
        total += v
    return total


def measure_overhead(n: int = N) -> dict:
    """loop_ns_per_element and vectorised_ns_per_element: median time of loop_sum(values) and of torch.sum on
    the same n floats as a float32 tensor, divided by n."""
    # TODO(week01): build the list and the tensor before timing; time both sums with time_calls.
    raise NotImplementedError("measure_overhead(): time loop_sum and torch.sum with your time_calls")


def measure_compiled(n: int = N) -> dict:
    """c_ns_per_element: the median time of loop_sum from loop_sum.c over n doubles, divided by n. Compile and
    link loop_sum.c with the system C compiler (cc -O2 -shared -fPIC) into a shared library in a temporary folder,
    load it with ctypes, and time it with time_calls."""
    # TODO(week01): subprocess.run(["cc", ...]); ctypes.CDLL(...).loop_sum with argtypes and restype; build the
    # (ctypes.c_double * n) array before timing.
    raise NotImplementedError("measure_compiled(): compile loop_sum.c with cc and time it through ctypes")


def main(out_dir: Path = Path("results"), quick: bool = False, sleep=time.sleep) -> None:
    """Run the experiments; write out_dir/samples.csv (experiment, rep, seconds) and out_dir/summary.csv
    (experiment, warmup, reps, scope, mean_s, p50_s, p95_s, p99_s, ...)."""
    # TODO(week01): the overhead pair, then run_concurrent at several concurrency levels for a call that
    # sleeps (sleep(0.005), with the `sleep` given) and a call that runs Python (loop_sum over a short list).
    raise NotImplementedError("main(): run the experiments and write samples.csv and summary.csv")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
