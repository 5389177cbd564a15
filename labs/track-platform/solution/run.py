"""The project's one run command: serve the course service alone (one FIFO: the baseline) and behind gateway.py
(two classes), drive both with the same load (a batch flood far above capacity, light interactive traffic
beside it), then set the batch quota too low on purpose (the failure case). Writes the raw records, a profile
table of where request time goes, and the failure case's record.

    python run.py --out raw               # about 15 s on two CPU cores
    python run.py --out raw --scale 4     # four times the requests (a GPU machine, or a longer run)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infracourse.kit import platform_service as ps
from infracourse.kit.loadgen import compute_metrics, run_load_async, write_records

HERE = Path(__file__).resolve().parent
INTERACTIVE_RATE, BATCH_LEAD_S = 3.0, 0.3      # interactive requests/s; the flood starts this much earlier


def short_folder() -> tempfile.TemporaryDirectory:
    """A temporary folder whose socket paths fit a Unix socket (107 bytes), whatever TMPDIR is."""
    return tempfile.TemporaryDirectory(dir="/tmp" if os.path.isdir("/tmp") else None)


def launch(command: list[str], folder: str, env: dict, log: str) -> subprocess.Popen:
    with open(os.path.join(folder, log), "w") as out:
        return subprocess.Popen(command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def environment(folder: str, device: str) -> dict:
    platform = {"journal": os.path.join(folder, "journal.jsonl")}
    return {**os.environ, **ps.platform_config(device).to_env(), ps.PLATFORM_ENV: json.dumps(platform)}


def start_gateway(folder: str, device: str, limits: dict | None = None) -> tuple[subprocess.Popen, str]:
    env = environment(folder, device)
    if limits:
        env[ps.CLASSES_ENV] = json.dumps(limits)
    sock = os.path.join(folder, "gateway.sock")
    return launch([sys.executable, "-m", "uvicorn", "gateway:app", "--uds", sock, "--app-dir", str(HERE),
                   "--no-access-log", "--log-level", "warning"], folder, env, "gateway.log"), sock


def start_service(folder: str, device: str) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(folder, "fifo.sock")
    return launch(ps.service_command(sock), folder, environment(folder, device), "fifo.log"), sock


def wait_ready(proc: subprocess.Popen, sock: str, what: str) -> None:
    began = time.monotonic()
    while time.monotonic() - began < 90:
        if asyncio.run(ps.probe(sock, "/health"))[0] == 200:
            return
        if proc.poll() is not None:
            sys.exit(f"{what} exited with code {proc.returncode}")
        time.sleep(0.05)
    sys.exit(f"{what} did not answer within 90 s")


async def two_classes(sock: str, n_interactive: int, n_batch: int, seed: int) -> dict:
    """A batch flood (all at once) and, BATCH_LEAD_S later, interactive requests at INTERACTIVE_RATE."""
    batch_specs = ps.capacity_specs(n_batch, seed=seed)
    interactive_specs = ps.capacity_specs(n_interactive, seed=seed + 1)
    flood = asyncio.create_task(run_load_async(batch_specs, uds=sock, seed=seed, timeout_s=30.0,
                                               extra_body={"request_class": "batch"}))
    await asyncio.sleep(BATCH_LEAD_S)
    interactive = await run_load_async(interactive_specs, uds=sock, rate=INTERACTIVE_RATE, burstiness=20.0,
                                       seed=seed, timeout_s=30.0, extra_body={"request_class": "interactive"})
    return {"interactive": interactive, "batch": await flood}


def summary(records, duration) -> dict:
    m = compute_metrics(records, duration, percentiles=(50, 99), goodput_slo_ms=ps.CAPACITY_SLO_MS)
    refused = sum(r.error.startswith(("HTTP 429", "HTTP 503")) for r in records)
    return {"sent": len(records), "succeeded": m["completed"], "refused": refused,
            "other_failures": m["failed"] - refused, "ttft_p50_ms": m["ttft_ms"]["p50"],
            "ttft_p99_ms": m["ttft_ms"]["p99"], "tpot_p99_ms": m["tpot_ms"]["p99"], "duration_s": duration}


def write_run(out: Path, name: str, server: str, runs: dict, n_batch: int) -> dict:
    records, duration = runs["interactive"]
    summaries = {cls: summary(*runs[cls]) for cls in ("interactive", "batch")}
    write_records(out / name, records, duration, server=server, request_class="interactive",
                  interactive_rate=INTERACTIVE_RATE, batch_flood=n_batch, batch_lead_s=BATCH_LEAD_S,
                  prompt_tokens=ps.CAPACITY_INPUT_LEN, output_tokens=ps.CAPACITY_OUTPUT_LEN, classes=summaries)
    return summaries


def service_log_times(path: str) -> tuple[float, float, int]:
    """(queue seconds, engine seconds, requests) summed over the course service's 'finished' log lines."""
    queue = total = 0.0
    n = 0
    for line in Path(path).read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "finished":
            queue, total, n = queue + event["queue_s"], total + event["duration_s"], n + 1
    return queue, total - queue, n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="raw")
    parser.add_argument("--scale", type=int, default=1, help="multiplies the number of requests")
    args = parser.parse_args()
    device = "cuda" if os.environ.get("INFRACOURSE_DEVICE") == "cuda" else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_interactive, n_batch = 8 * args.scale, 24 * args.scale
    with short_folder() as fifo_dir, short_folder() as gw_dir:
        fifo, fifo_sock = start_service(fifo_dir, device)     # both start at once: their start-ups overlap
        gateway, gw_sock = start_gateway(gw_dir, device)
        try:
            wait_ready(fifo, fifo_sock, "the course service")
            baseline = write_run(out, "baseline.json", "course service alone (one FIFO)",
                                 asyncio.run(two_classes(fifo_sock, n_interactive, n_batch, seed=1)), n_batch)
            os.killpg(fifo.pid, signal.SIGKILL)
            fifo.wait()
            fifo_queue, fifo_engine, fifo_n = service_log_times(os.path.join(fifo_dir, "fifo.log"))

            wait_ready(gateway, gw_sock, "the gateway")
            isolated = write_run(out, "isolated.json", "gateway.py (two classes)",
                                 asyncio.run(two_classes(gw_sock, n_interactive, n_batch, seed=1)), n_batch)
            state = asyncio.run(ps.probe(gw_sock, "/admin/classes"))[1] or {}

            # the failure case: a batch quota of 0 slots (set too low) while interactive load is light
            asyncio.run(post(gw_sock, "/admin/classes", {"batch_slots": 0}))
            failed = asyncio.run(two_classes(gw_sock, n_interactive // 2, n_batch // 2, seed=3))
            asyncio.run(post(gw_sock, "/admin/classes", {"batch_slots": ps.class_limits()["batch_slots"]}))
        finally:
            for proc in (fifo, gateway):
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    queued = state.get("queued_seconds", {})
    rows = [
        {"name": "FIFO: waiting in the service's queue", "total_ms": fifo_queue * 1000, "count": fifo_n},
        {"name": "FIFO: in the engine (admitted to last token)", "total_ms": fifo_engine * 1000, "count": fifo_n},
        {"name": "classes: interactive waiting in the gateway's queue", "total_ms": queued.get("interactive", 0) * 1000,
         "count": isolated["interactive"]["succeeded"]},
        {"name": "classes: batch waiting in the gateway's queue", "total_ms": queued.get("batch", 0) * 1000,
         "count": isolated["batch"]["succeeded"]},
    ]
    (out / "profile.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    starved = {cls: summary(*failed[cls]) for cls in ("interactive", "batch")}
    (out / "failure.json").write_text(json.dumps({
        "case": "batch quota set too low (0 slots) while interactive load is light",
        "expected": "batch starves: no batch request succeeds; each is refused at once (429), none hangs",
        "classes": starved}, indent=1) + "\n")
    print(json.dumps({"baseline": baseline, "isolated": isolated, "failure": starved}, indent=1))


async def post(sock: str, path: str, body: dict) -> None:
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_unix_connection(sock)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    await writer.drain()
    await reader.read()
    writer.close()


if __name__ == "__main__":
    main()
