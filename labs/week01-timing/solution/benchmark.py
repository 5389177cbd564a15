"""Week 1 experiments (reference solution).

1. Python's cost per element against one vectorised call: a for-loop summing a list, and torch.sum.
2. Latency, throughput and concurrency: the same call made from 1..16 threads at once, for a call that
   sleeps (like I/O: threads overlap) and for a call that runs Python bytecode (the GIL serialises it).

`python benchmark.py` writes results/samples.csv (every timed repetition) and results/summary.csv (one
line per experiment, recomputable from the samples).
"""
from __future__ import annotations

import csv
import ctypes
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness import run_concurrent, summarize, time_calls

N = 100_000


def no_sync() -> None:
    """The work below runs on the CPU and is finished when the call returns: nothing to wait for."""


def loop_sum(values: list[float]) -> float:
    total = 0.0
    for v in values:
        total += v
    return total


def measure_overhead(n: int = N, reps: int = 20) -> dict:
    """Nanoseconds per element of a Python loop and of torch.sum over the same n floats (medians)."""
    values = [random.random() for _ in range(n)]
    tensor = torch.tensor(values)  # converted once, outside the timed region: we time the sum only
    loop = time_calls(loop_sum, lambda: (values,), warmup=2, reps=reps, sync=no_sync)
    vectorised = time_calls(torch.sum, lambda: (tensor,), warmup=5, reps=reps, sync=no_sync)
    return {
        "n": n,
        "loop_ns_per_element": statistics.median(loop) / n * 1e9,
        "vectorised_ns_per_element": statistics.median(vectorised) / n * 1e9,
        "samples": {"python-loop": loop, "torch-sum": vectorised},
    }


def measure_compiled(n: int = N, reps: int = 20) -> dict:
    """Nanoseconds per element of loop_sum.c (compiled and linked here by the system C compiler, called through
    ctypes) over n doubles, the median of `reps` calls; `total` is its sum of those values."""
    source = Path(__file__).with_name("loop_sum.c")
    build = Path(tempfile.mkdtemp(prefix="loop-sum-"))  # the learner folder may be read-only: build elsewhere
    library = build / "loop_sum.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    c_sum = ctypes.CDLL(str(library)).loop_sum
    c_sum.argtypes, c_sum.restype = (ctypes.POINTER(ctypes.c_double), ctypes.c_long), ctypes.c_double
    values = (ctypes.c_double * n)(*(random.random() for _ in range(n)))  # converted once, before timing
    samples = time_calls(c_sum, lambda: (values, n), warmup=3, reps=reps, sync=no_sync)
    return {"n": n, "c_ns_per_element": statistics.median(samples) / n * 1e9, "total": c_sum(values, n),
            "samples": samples}


def main(out_dir: Path = Path("results"), quick: bool = False, sleep=time.sleep) -> list[dict]:
    n, reps, calls, levels = (20_000, 10, 8, (1, 4)) if quick else (N, 50, 40, (1, 2, 4, 8, 16))
    overhead = measure_overhead(n, reps)
    compiled = measure_compiled(n, reps)
    runs = [  # (experiment, warm-up calls, timed region, samples, extra columns)
        ("c-loop", 3, f"loop_sum.c (cc -O2, via ctypes) over {n} doubles", compiled["samples"], {"n": n}),
        ("python-loop", 2, f"loop_sum over a list of {n} floats", overhead["samples"]["python-loop"], {"n": n}),
        ("torch-sum", 5, f"torch.sum of a {n}-element float32 tensor", overhead["samples"]["torch-sum"], {"n": n}),
    ]
    small = [random.random() for _ in range(20_000)]
    workloads = {"sleep": lambda: sleep(0.005), "python": lambda: loop_sum(small)}
    for name, fn in workloads.items():
        for c in levels:
            result = run_concurrent(fn, concurrency=c, calls=calls * c)
            runs.append((f"{name}-c{c}", c, f"one {name} call from its start to its end, {c} threads at once",
                         result["latencies"], {"concurrency": c, "throughput_per_s": result["throughput"]}))

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out_dir / "samples.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["experiment", "rep", "seconds"])
        for experiment, warmup, scope, samples, extra in runs:
            writer.writerows((experiment, i, repr(s)) for i, s in enumerate(samples))  # repr: no digits lost
            stats = summarize(samples)
            rows.append({"experiment": experiment, "warmup": warmup, "reps": stats["n"], "scope": scope,
                         **{f"{k}_s": stats[k] for k in ("mean", "std", "p50", "p95", "p99")}, **extra})
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(out_dir / "summary.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(f"{row['experiment']:>12}  p50 {row['p50_s'] * 1e3:9.3f} ms  p99 {row['p99_s'] * 1e3:9.3f} ms  "
              + (f"{row['throughput_per_s']:8.1f} calls/s" if "throughput_per_s" in row else ""))
    print(f"Compiled C loop {compiled['c_ns_per_element']:.2f} ns/element")
    print(f"Python loop {overhead['loop_ns_per_element']:.1f} ns/element, "
          f"torch.sum {overhead['vectorised_ns_per_element']:.3f} ns/element")
    return rows


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
