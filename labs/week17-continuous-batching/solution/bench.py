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
    cfg = batching.bench_config(device)
    stand_in = (f"a {cfg.step_floor_ms:g} ms step floor (the course's ModelRunner sleeps every step up to it), "
                f"standing in for a device whose step costs the same for 1 or {cfg.max_num_seqs} sequences")
    conditions = {"device": device, "stand_in": stand_in, "serve_config": vars(cfg), "prefix_caching": False,
                  "kv_cache": "paged; every block free before each cell, nothing cached across requests",
                  "queue": f"up to {cfg.max_waiting} waiting beyond {cfg.max_num_seqs} running, then 429"}
    rows = run_matrix(MATRIX, HERE / "matrix", seed=0, vocab_size=batching.SERVE_GPT.vocab_size,
                      goodput_slo_ms=batching.BENCH_SLO_MS, conditions=conditions, uds=sock, timeout_s=60.0)
    plot_latency_throughput(rows, HERE / "matrix" / "latency_throughput.png",
                            title=f"{device}: {stand_in.split(' (')[0]}" if cfg.step_floor_ms else device)
    return rows


def matrix_figures(rows: list[dict]) -> dict[str, float]:
    """The report's figures of the matrix: its heaviest closed-loop cell, the gain from 4 users over 1 on the
    same lengths, and the bursty cell's tail."""
    m = {row["file"].removesuffix(".json"): row["metrics"] for row in rows}
    return {"matrix_cells": len(rows),
            "matrix_heaviest_output_tokens_per_s": m[HEAVIEST]["output_throughput"],
            "matrix_heaviest_ttft_p99_ms": m[HEAVIEST]["ttft_ms"]["p99"],
            "matrix_concurrency_gain": m[HEAVIEST]["output_throughput"] / m["in64-out16-c1"]["output_throughput"],
            "matrix_bursty_ttft_p99_ms": m[BURSTY]["ttft_ms"]["p99"]}


def figures(metrics: dict, rss_mib: float) -> dict[str, float]:
    cost = serving_cost(metrics, batching.DEVICE_PRICE_PER_HOUR)
    cfg = batching.bench_config()
    return {
        "ttft_p50_ms": metrics["ttft_ms"]["p50"], "ttft_p99_ms": metrics["ttft_ms"]["p99"],
        "tpot_p50_ms": metrics["tpot_ms"]["p50"],  # (E2EL - TTFT) / (n - 1): decode steps only
        "e2el_p50_ms": metrics["e2el_ms"]["p50"], "e2el_p95_ms": metrics["e2el_ms"]["p95"],
        "e2el_p99_ms": metrics["e2el_ms"]["p99"],
        "requests_per_s": metrics["request_throughput"], "output_tokens_per_s": metrics["output_throughput"],
        "goodput_requests_per_s": metrics["request_goodput"],
        "failure_rate": metrics["failed"] / (metrics["completed"] + metrics["failed"]),
        "server_peak_rss_mb": rss_mib,
        "usd_per_1k_requests": cost["usd_per_1k_requests"], "usd_per_1m_output_tokens": cost["usd_per_1m_output_tokens"],
        "kv_cache_mib": batching.kv_pool_bytes(batching.SERVE_GPT, cfg.num_blocks, cfg.block_size) / 2**20,
        "concurrency": batching.BENCH_CONCURRENCY, "max_waiting": cfg.max_waiting, "max_num_seqs": cfg.max_num_seqs,
        "kv_blocks": cfg.num_blocks, "kv_block_size": cfg.block_size,  # prefix caching off, the pool cold
        "device_price_usd_per_hour": batching.DEVICE_PRICE_PER_HOUR,
    }


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
    write_records(HERE / "records.json", records, duration, specs="bench_specs(0)",
                  arrivals="all at once (rate inf)", concurrency=batching.BENCH_CONCURRENCY, prefix_caching=False,
                  serve_config=vars(batching.bench_config(device)))
    print("```yaml figures")
    for name, value in {**figures(metrics, rss), **matrix_figures(rows)}.items():
        print(f"{name}: {value:.6g}")
    print("```")


if __name__ == "__main__":
    main()
