"""Per-class capacity: the highest interactive arrival rate at which >= 99 % of interactive requests meet the
SLO (TTFT <= 400 ms, TPOT <= 60 ms) while a batch flood keeps the batch class saturated. Serves gateway.py as
the judge does and sweeps upward in 5 % steps until the goodput fraction falls under 99 %. Writes capacity.json.

    python sweep.py            # about two minutes on a CPU
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from run import short_folder, start_gateway, wait_ready

from infracourse.kit import platform_service as ps
from infracourse.kit.loadgen import compute_metrics, run_load_async, serving_cost

HERE = Path(__file__).resolve().parent
START_RATE, STEP = 4.0, 1.05       # interactive requests/s, and the factor between sweep points (5 %)
SECONDS = 8.0                      # each point's interactive load lasts about this long
BATCH_RATE, BATCH_LEAD_S = 12.0, 0.6   # the judge's batch flood: far above what its quota serves, 0.6 s ahead


async def saturated(sock: str, rate: float, seed: int) -> dict:
    n = max(20, round(rate * SECONDS))
    batch_n = round(BATCH_RATE * (BATCH_LEAD_S + n / rate))
    flood = asyncio.create_task(run_load_async(ps.capacity_specs(batch_n, seed=seed + 1), uds=sock, rate=BATCH_RATE,
                                               seed=seed, timeout_s=60.0, extra_body={"request_class": "batch"}))
    await asyncio.sleep(BATCH_LEAD_S)
    records, duration = await run_load_async(ps.capacity_specs(n, seed=seed), uds=sock, rate=rate,
                                             burstiness=ps.CAPACITY_BURSTINESS, seed=seed, timeout_s=60.0,
                                             extra_body={"request_class": "interactive"})
    batch, batch_duration = await flood
    m = compute_metrics(records, duration, percentiles=(50, 99), goodput_slo_ms=ps.CAPACITY_SLO_MS)
    bm = compute_metrics(batch, batch_duration)
    return {"rate": rate, "requests": n, "goodput_fraction": round(m["request_goodput"] * duration) / n,
            "metrics": m, "batch_completed": bm["completed"], "batch_sent": batch_n,
            "wall_s": batch_duration, "successes": m["completed"] + bm["completed"]}


def main() -> None:
    device = "cuda" if os.environ.get("INFRACOURSE_DEVICE") == "cuda" else "cpu"
    with short_folder() as folder:
        gateway, sock = start_gateway(folder, device)
        try:
            wait_ready(gateway, sock, "the gateway")
            points, rate = [], START_RATE
            while True:
                p = asyncio.run(saturated(sock, rate, seed=len(points)))
                m = p["metrics"]
                print(f"{rate:6.2f}/s: {p['goodput_fraction']:6.1%} within the SLO, P99 TTFT "
                      f"{m['ttft_ms']['p99']:6.0f} ms, P99 TPOT {m['tpot_ms']['p99']:4.0f} ms, {m['failed']} failed; "
                      f"batch {p['batch_completed']}/{p['batch_sent']} served", flush=True)
                points.append(p)
                if p["goodput_fraction"] < ps.CAPACITY_GOODPUT_FRACTION or rate > 100:
                    break
                rate *= STEP
        finally:
            os.killpg(gateway.pid, signal.SIGKILL)
            gateway.wait()
    held = [p for p in points if p["goodput_fraction"] >= ps.CAPACITY_GOODPUT_FRACTION]
    if not held:
        sys.exit(f"no rate held the SLO, not even {START_RATE:g}/s: start lower")
    best = held[-1]
    cost = serving_cost({"duration_s": best["wall_s"], "completed": best["successes"], "total_output": 1},
                        ps.DEVICE_PRICE_PER_HOUR)
    (HERE / "capacity.json").write_text(json.dumps({
        "interactive_capacity_requests_per_s": round(best["rate"], 4),
        "slo_ms": ps.CAPACITY_SLO_MS, "goodput_fraction_target": ps.CAPACITY_GOODPUT_FRACTION,
        "batch_flood": {"rate": BATCH_RATE, "lead_s": BATCH_LEAD_S, "limits": ps.class_limits()},
        "usd_per_success_at_capacity": cost["usd_per_request"],
        "points": [{k: v for k, v in p.items() if k != "metrics"} | {
            "ttft_p99_ms": p["metrics"]["ttft_ms"]["p99"], "tpot_p99_ms": p["metrics"]["tpot_ms"]["p99"],
            "failed": p["metrics"]["failed"]} for p in points],
    }, indent=1) + "\n")
    print(json.dumps({"interactive_capacity_requests_per_s": round(best["rate"], 4),
                      "ttft_p99_ms": best["metrics"]["ttft_ms"]["p99"], "usd_per_success": cost["usd_per_request"]}))


if __name__ == "__main__":
    main()
