"""Serve the shared-prefix workload through your paged.py with and without prefix caching, and print the
report's figures (the grader measures the same workload, kit.paged_generation, on its own clock).

    python bench.py        # a few seconds on a CPU; copy the printed figures into report.md
"""
from __future__ import annotations

import time

import torch

import paged
from infracourse.kit import paged_generation as pg
from infracourse.kit.threads import intra_op_threads


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    clock = time.process_time if device == "cpu" else time.perf_counter  # CPU: work done, not time waited
    with intra_op_threads(1):
        runs = pg.serve_shared_prefix(paged, 0, clock, device)
    figures = {caching: pg.serving_figures(*runs[caching]) for caching in runs}
    print(f"{'':16}{'prefix caching on':>20}{'off':>12}")
    for key in figures[True]:
        print(f"{key:16}{figures[True][key]:>20.4g}{figures[False][key]:>12.4g}")
    print("\nfigures for report.md:")
    print(f"ttft_saved_ms: {figures[False]['ttft_p50_ms'] - figures[True]['ttft_p50_ms']:.3g}")
    print(f"kv_bytes_cached: {figures[True]['kv_bytes']}")
    print(f"kv_bytes_uncached: {figures[False]['kv_bytes']}")


if __name__ == "__main__":
    main()
