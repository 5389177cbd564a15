"""Serve server.py with the load point's limits, drive the load point, write every request's raw record to
records.json and print the report's figures.

    python bench.py            # a few seconds; then copy the printed figures into report.md
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
from infracourse.kit.loadgen import compute_metrics, run_load, serving_cost, write_records

HERE = Path(__file__).resolve().parent


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
        finally:
            proc.terminate()
            proc.wait()
    metrics = compute_metrics(records, duration, percentiles=(50, 95, 99), goodput_slo_ms=batching.BENCH_SLO_MS)
    write_records(HERE / "records.json", records, duration, specs="bench_specs(0)",
                  arrivals="all at once (rate inf)", concurrency=batching.BENCH_CONCURRENCY, prefix_caching=False,
                  serve_config=vars(batching.bench_config(device)))
    print("```yaml figures")
    for name, value in figures(metrics, rss).items():
        print(f"{name}: {value:.6g}")
    print("```")


if __name__ == "__main__":
    main()
