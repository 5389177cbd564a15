"""Time a kernel lab's solution against torch across sizes with the course harness (GPU).

    python benchmarks/kernel_sizes.py week07

Prints a Markdown table (size, ours, torch, GB/s, ratio): the raw data behind a lab's reference report and
docs/gpu-results.md. Uses infracourse.bench.measure, the same harness the graders use.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from infracourse import bench

REPO = Path(__file__).resolve().parent.parent


def _solution(lab: str, module: str):
    path = REPO / "labs" / lab / "solution" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(module, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def week07() -> list[tuple]:
    ops = _solution("week07-triton-basics", "vector_ops")
    rows = []
    for n in (4096, 2**20, 2**26 + 3):
        pairs = lambda: (torch.randn(n, device="cuda"), torch.randn(n, device="cuda"))  # noqa: E731
        single = lambda: (torch.randn(n, device="cuda"),)  # noqa: E731
        for name, ours, ref, make, nbytes in (("add", ops.add, torch.add, pairs, 12 * n),
                                              ("reduce_sum", ops.reduce_sum, torch.sum, single, 4 * n)):
            t_ours = bench.measure(ours, make_args=make).seconds
            t_ref = bench.measure(ref, make_args=make).seconds
            rows.append((name, n, t_ours * 1e6, t_ref * 1e6, nbytes / t_ours / 1e9, t_ref / t_ours))
    return rows


if __name__ == "__main__":
    table = globals()[sys.argv[1]]()
    print("| op | n | ours (us) | torch (us) | ours GB/s | torch/ours |\n|---|---|---|---|---|---|")
    for name, n, ours, ref, gbps, ratio in table:
        print(f"| {name} | {n} | {ours:.1f} | {ref:.1f} | {gbps:.0f} | {ratio:.2f} |")
