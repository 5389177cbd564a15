"""Serve server.py with the load point's limits, drive the load point, write every request's raw record to
records.json, run the load matrix into matrix/ (raw records per cell, matrix.json, the latency-throughput plot)
and print the report's figures.

    python bench.py            # about 15 s; then copy the printed figures into report.md
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infracourse.kit import batching
from infracourse.kit.load_matrix import load_matrix, plot_latency_throughput, run_matrix
from infracourse.kit.loadgen import compute_metrics, run_load, serving_cost, write_records

HERE = Path(__file__).resolve().parent
# The handout's load matrix: 2 prompt lengths x 2 output lengths, each under a closed loop of 1 and of 4 users
# and an open loop of 32 requests/s, Poisson (burstiness 1) and bursty (0.25); 8 requests a cell
MATRIX = load_matrix(input_lens=[16, 64], output_lens=[4, 16], concurrencies=[1, 4], rates=[32.0],
                     burstiness=[1.0, 0.25], requests=8)
HEAVIEST, BURSTY = "in64-out16-c4", "in64-out16-r32-b0.25"  # the cells the report quotes


def start_server(folder: str, device: str) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(folder, "server.sock")
    env = {**os.environ, **batching.bench_config(device).to_env()}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "server:app", "--uds", sock, "--no-access-log",
                             "--log-level", "warning"], cwd=HERE, env=env)
    for _ in range(600):  # up to a minute for torch's import
        if os.path.exists(sock):
            return proc, sock
        if proc.poll() is not None:
            sys.exit(f"the server exited with code {proc.returncode}")
        time.sleep(0.1)
    proc.kill()
    sys.exit("the server did not start within a minute")


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 1024


def run_load_matrix(sock: str, device: str) -> list[dict]:
    """Every cell of MATRIX through the server, one after the other (cell k with seed k): raw records and
    matrix.json in matrix/, the latency-throughput curves beside them."""
    raise NotImplementedError("TODO: kit.load_matrix.run_matrix(MATRIX, HERE / 'matrix', seed=0, vocab_size=128, "
                              "goodput_slo_ms=batching.BENCH_SLO_MS, conditions={device, stand_in, serve_config, "
                              "...}, uds=sock), then plot_latency_throughput(rows, ...) (see the handout)")


def matrix_figures(rows: list[dict]) -> dict[str, float]:
    """The report's figures of the matrix (the matrix_* names of its figures block), from run_matrix's rows."""
    raise NotImplementedError("TODO: matrix_cells, and from the rows' metrics: the heaviest cell's output tok/s and "
                              "P99 TTFT, the gain of in64-out16-c4 over in64-out16-c1, the bursty cell's P99 TTFT")


def figures(metrics: dict, rss_mib: float) -> dict[str, float]:
    """The report's figures (the names of its figures block) from the metrics of the run."""
    raise NotImplementedError("TODO: every figure of report.md's block, from kit.loadgen.compute_metrics's result "
                              "and serving_cost (at batching.DEVICE_PRICE_PER_HOUR)")


def main() -> None:
    device = "cuda" if os.environ.get("INFRACOURSE_DEVICE") == "cuda" else "cpu"
    specs = batching.bench_specs(0)
    with tempfile.TemporaryDirectory() as folder:
        proc, sock = start_server(folder, device)
        try:
            records, duration = run_load(specs, uds=sock, concurrency=batching.BENCH_CONCURRENCY, timeout_s=60.0)
            rss = peak_rss_mib(proc.pid)
            rows = run_load_matrix(sock, device)
        finally:
            proc.terminate()
            proc.wait()
    metrics = compute_metrics(records, duration, percentiles=(50, 95, 99), goodput_slo_ms=batching.BENCH_SLO_MS)
    # TODO: write the raw records to records.json (kit.loadgen.write_records), with the run's conditions
    print("```yaml figures")
    for name, value in {**figures(metrics, rss), **matrix_figures(rows)}.items():
        print(f"{name}: {value:.6g}")
    print("```")


if __name__ == "__main__":
    main()
