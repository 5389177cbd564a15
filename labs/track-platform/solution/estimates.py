"""Estimates made before measuring (the judge checks each formula on its own cases, then the measured run
against your estimate).

Cost per successful request: the device is rented by the hour and paid for the whole wall time of the run,
idle moments included (a queue that drains, a slot between two requests): dollars = price x wall time; only
successful requests share it (a refused or failed request costs, it does not count).
"""
from __future__ import annotations

import math


def usd_per_success(price_per_hour: float, wall_s: float, successes: float) -> float:
    """Dollars per successful request of a run lasting wall_s seconds on a device rented at price_per_hour;
    math.inf when nothing succeeded."""
    if successes <= 0:
        return math.inf
    return price_per_hour * wall_s / 3600.0 / successes


def successes_per_s(interactive_rate: float, batch_slots: int, output_tokens: int, step_ms: float) -> float:
    """Requests completed per second while batch is saturated: every interactive request (the rate is under
    capacity) plus batch at its quota's ceiling: batch_slots sequences, each output_tokens steps of step_ms."""
    return interactive_rate + batch_slots / (output_tokens * step_ms / 1000.0)
