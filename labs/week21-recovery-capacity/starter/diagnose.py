"""Name a fault and when it began from a service's logs and metrics alone.

    diagnose(logs, metrics) -> {"fault": "process_exit" | "overload" | "slow_dependency", "began_at": epoch s}

logs: the service's JSON log lines ({"ts", "event", ...}: "ready", "request" at each arrival, "finished" with
queue_s and duration_s, ...); metrics: the judge's scrapes of its GET /debug/state every 0.1 s, {"t", "up" (0
when the scrape got no answer), and when up: "running", "waiting", "requests_total", "finished_total",
"steps_total", "step_seconds_total", ...}. Times are epoch seconds (time.time()).
"""
from __future__ import annotations


def diagnose(logs: list[dict], metrics: list[dict]) -> dict:
    """TODO: find the first moment the service leaves its steady state, and how: it stops answering, arrivals
    and the queue jump while a step takes as long as before, or each step takes longer while arrivals do not
    change."""
    raise NotImplementedError("diagnose: name the fault and when it began from the logs and metrics")
