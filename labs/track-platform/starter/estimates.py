"""Estimates made before measuring (the judge checks each formula on its own cases, then the measured run
against your estimate)."""
from __future__ import annotations


def usd_per_success(price_per_hour: float, wall_s: float, successes: float) -> float:
    """Dollars per successful request of a run lasting wall_s seconds on a device rented at price_per_hour,
    idle time paid; math.inf when nothing succeeded."""
    raise NotImplementedError("usd_per_success: the device is paid for the whole wall time")


def successes_per_s(interactive_rate: float, batch_slots: int, output_tokens: int, step_ms: float) -> float:
    """Requests completed per second while batch is saturated (interactive below its capacity)."""
    raise NotImplementedError("successes_per_s: every interactive request, plus batch at its quota's ceiling")
