"""Timing parity of the judge/worker split on a GPU: a kernel timed in-process (bench.measure, the way graders
timed before the split) against the same kernel timed through the worker and clocked by the judge
(grading.perf.timed). Issue 9 allows at most 2 % between them for honest kernels.

    python benchmarks/split_parity.py labs/week07-triton-basics/solution vector_ops add
"""
from __future__ import annotations

import importlib
import statistics
import sys
from pathlib import Path


from infracourse import bench
from infracourse.compare import assert_close
from infracourse.grading import perf
from infracourse.grading.inputs import build, tensors
from infracourse.grading.remote import WorkerClient


def main(folder: str, module: str, function: str, n: int = 2**26 + 3, rounds: int = 5) -> None:
    spec = tensors([[n], [n]], seed=7)
    generate = build(spec)

    def check(out, args):
        assert_close(out, args[0].double() + args[1].double(), what="add")

    sys.path.insert(0, str(Path(folder).resolve()))
    local = getattr(importlib.import_module(module), function)
    worker = WorkerClient(Path(folder), gpu=True)
    remote = getattr(worker.module(module), function)
    counter = iter(range(10**9))
    before, after = [], []
    for _ in range(rounds):
        old = bench.measure(local, make_args=lambda: generate(next(counter)), check=check)
        new = perf.timed(remote, spec, check=check, label="add", require_kernel=True)  # as week 7 grades it
        before.append(old.seconds)
        after.append(new.seconds)
        print(f"in-process {old.seconds * 1e6:8.1f} us (events {old.median_s * 1e6:.1f}, wall {old.wall_per_call_s * 1e6:.1f})"
              f" | split {new.seconds * 1e6:8.1f} us (events {new.median_s * 1e6:.1f}, judge wall {new.wall_per_call_s * 1e6:.1f})")
    b, a = statistics.median(before), statistics.median(after)
    print(f"median in-process {b * 1e6:.1f} us, split {a * 1e6:.1f} us: {100 * (a - b) / b:+.2f} %; "
          f"{3 * n * 4 / a / 1e9:.0f} GB/s through the split")
    worker.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
