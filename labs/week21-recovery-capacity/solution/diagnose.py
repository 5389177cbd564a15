"""Name a fault and when it began from a service's logs and metrics alone.

    diagnose(logs, metrics) -> {"fault": "process_exit" | "overload" | "slow_dependency", "began_at": epoch s}

logs: the service's JSON log lines ({"ts", "event", ...}); metrics: scrapes of its /debug/state every 0.1 s,
{"t", "up", and when up: "running", "waiting", "requests_total", "steps_total", "step_seconds_total", ...}.
"""
from __future__ import annotations

import statistics

WINDOW_S = 0.5        # step times and arrival rates are judged over windows of this length
BASELINE_S = 1.0      # the first second is the steady state
HOLD_S = 0.5          # a step time that rose stays up this long (or to the end of the scrapes) to count


def _windows(samples: list[dict]) -> list[tuple[float, float, float]]:
    """(time, mean step seconds, arrivals per second) over each WINDOW_S of consecutive up samples."""
    out = []
    for i, b in enumerate(samples):
        a = next((x for x in reversed(samples[:i]) if b["t"] - x["t"] >= WINDOW_S), None)
        if a is None:
            continue
        steps = b["steps_total"] - a["steps_total"]
        step_s = (b["step_seconds_total"] - a["step_seconds_total"]) / steps if steps else 0.0
        out.append((b["t"], step_s, (b["requests_total"] - a["requests_total"]) / (b["t"] - a["t"])))
    return out


def diagnose(logs: list[dict], metrics: list[dict]) -> dict:
    metrics = sorted(metrics, key=lambda m: m["t"])
    down = [m for m in metrics if not m.get("up")]
    up = [m for m in metrics if m.get("up")]
    if down:  # the process stopped answering: it exited; it began after the last thing it said
        last_log = max((e["ts"] for e in logs if e.get("ts", 0) <= down[0]["t"]), default=down[0]["t"])
        last_up = up[-1]["t"] if up and up[-1]["t"] < down[0]["t"] else down[0]["t"]
        return {"fault": "process_exit", "began_at": max(last_log, last_up)}
    start = up[0]["t"]
    steady = [m for m in up if m["t"] - start <= BASELINE_S]
    windows = _windows(up)
    base = [w for w in windows if w[0] - start <= BASELINE_S] or windows[:3]
    step0 = statistics.median(w[1] for w in base)
    waiting0 = max(m["waiting"] for m in steady)
    # a slow dependency slows every step from then on; a busy CPU slows a few: the rise must last HOLD_S
    slow_at = next((t - WINDOW_S / 2 for t, step_s, _ in windows if step_s > 2.0 * step0
                    and all(w[1] > 2.0 * step0 for w in windows if t <= w[0] <= t + HOLD_S)), None)
    arrivals = sorted(e["ts"] for e in logs if e.get("event") == "request")
    burst_at = None
    for i in range(len(arrivals) - 8):  # 8 arrivals within 0.1 s: no steady 4/s does that
        if arrivals[i + 8] - arrivals[i] < 0.1:
            burst_at = arrivals[i]
            break
    if burst_at is None:
        burst_at = next((m["t"] for m in up if m["waiting"] > waiting0 + 8), None)
    if burst_at is not None and (slow_at is None or burst_at <= slow_at):
        return {"fault": "overload", "began_at": burst_at}
    if slow_at is not None:
        return {"fault": "slow_dependency", "began_at": slow_at}
    return {"fault": "overload", "began_at": up[-1]["t"]}
