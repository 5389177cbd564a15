"""Week 24, capacity: capacity.json's interactive rate (batch saturated beside it) holds the SLO when the judge
runs it again at 0.9x and breaks it at 1.15x; and the cost per successful request the learner estimates before
measuring matches the judge's run."""
import math

import pytest

from infracourse.grader import LabCheckFailed, check_formula, check_measured
from infracourse.kit import platform_service as ps
from infracourse.kit.loadgen import serving_cost
from track_platform_judging import CAPACITY_ABOVE, CAPACITY_BELOW, CAPACITY_FLOOD_RATE, LIMITS

SLO = f"TTFT <= {ps.CAPACITY_SLO_MS['ttft']:g} ms and TPOT <= {ps.CAPACITY_SLO_MS['tpot']:g} ms"
ESTIMATE_FACTOR = 1.5


@pytest.mark.check("capacity-reproduced")
def test_capacity_reproduced(capacity, record):
    c = capacity.get()
    claimed, below, above = c["claimed"], c["below"], c["above"]
    twice = "" if c.get("below_first") is None else f" (run twice: {c['below_first']:.1%} the first time)"
    m = below["metrics"]
    if below["good_fraction"] < ps.CAPACITY_GOODPUT_FRACTION:
        raise LabCheckFailed(
            f"capacity.json claims {claimed:.3g} interactive requests/s; the judge ran {below['n']} at "
            f"{CAPACITY_BELOW:g}x that ({below['rate']:.3g}/s, gamma arrivals, burstiness "
            f"{ps.CAPACITY_BURSTINESS:g}) beside a batch flood of {CAPACITY_FLOOD_RATE:g}/s and only "
            f"{below['good_fraction']:.1%} met {SLO}{twice} ({m['failed']} failed, P99 TTFT {m['ttft_ms']['p99']:.0f} ms), "
            f"{ps.CAPACITY_GOODPUT_FRACTION:.0%} needed. Report the highest rate your sweep measured holding the SLO "
            "with batch saturated, not an extrapolation")
    if above["good_fraction"] >= ps.CAPACITY_GOODPUT_FRACTION:
        raise LabCheckFailed(
            f"capacity.json claims {claimed:.3g} interactive requests/s, but at {CAPACITY_ABOVE:g}x that "
            f"({above['rate']:.3g}/s, batch flooding beside it) {above['good_fraction']:.1%} still met {SLO}: the "
            "claim is not the highest rate. Sweep upward in steps of at most 5 % until the goodput fraction falls "
            "under 99 %, and report the last rate before it")
    if below["batch_successes"] == 0:
        raise LabCheckFailed(f"at {below['rate']:.3g} interactive requests/s no batch request succeeded: the "
                             "capacity was bought by starving batch (its quota is a share it keeps)")
    cost = serving_cost({"duration_s": below["wall_s"], "completed": below["successes"], "total_output": 1},
                        ps.DEVICE_PRICE_PER_HOUR)
    record("capacity", claimed, unit="requests/s")
    record("ttft p99", m["ttft_ms"]["p99"], unit="ms")
    record("batch served", below["batch_successes"], unit="requests")
    record("usd per success", cost["usd_per_request"], unit="USD")


def reference_usd_per_success(price_per_hour, wall_s, successes):
    cost = serving_cost({"duration_s": wall_s, "completed": successes, "total_output": 1}, price_per_hour)
    return cost["usd_per_request"]


def reference_successes_per_s(interactive_rate, batch_slots, output_tokens, step_ms):
    return interactive_rate + batch_slots / (output_tokens * step_ms / 1000.0)


COST_CASES = [{"price_per_hour": 2.0, "wall_s": 3600.0, "successes": 1000},
              {"price_per_hour": 2.0, "wall_s": 12.5, "successes": 97},
              {"price_per_hour": 3.5, "wall_s": 0.8, "successes": 3}]
RATE_CASES = [{"interactive_rate": 5.0, "batch_slots": 2, "output_tokens": 12, "step_ms": 25.0},
              {"interactive_rate": 0.0, "batch_slots": 1, "output_tokens": 100, "step_ms": 10.0},
              {"interactive_rate": 12.5, "batch_slots": 6, "output_tokens": 32, "step_ms": 40.0}]


@pytest.mark.check("cost-estimate")
def test_cost_per_success_estimate(learner, capacity, device, record):

    mod = learner.module("estimates")
    check_formula("usd_per_success", mod.usd_per_success, reference_usd_per_success, COST_CASES)
    nothing = mod.usd_per_success(price_per_hour=2.0, wall_s=10.0, successes=0)
    if not (isinstance(nothing, float) and math.isinf(nothing)):
        raise LabCheckFailed(f"usd_per_success(price_per_hour=2.0, wall_s=10.0, successes=0) returned {nothing!r}: "
                             "a run with no success paid for its time and bought nothing: return math.inf")
    check_formula("successes_per_s", mod.successes_per_s, reference_successes_per_s, RATE_CASES)
    c = capacity.get()
    below = c["below"]
    step_ms = c["step_ms"] or ps.platform_config(device).step_floor_ms  # the service's mean step in that run
    rate = mod.successes_per_s(interactive_rate=below["rate"], batch_slots=LIMITS["batch_slots"],
                               output_tokens=ps.CAPACITY_OUTPUT_LEN, step_ms=step_ms)
    planned = below["wall_s"]
    estimate = mod.usd_per_success(price_per_hour=ps.DEVICE_PRICE_PER_HOUR, wall_s=planned, successes=rate * planned)
    measured = reference_usd_per_success(ps.DEVICE_PRICE_PER_HOUR, below["wall_s"], below["successes"])
    record("usd per success estimate", estimate, target=measured, unit="USD")
    check_measured("usd_per_success", estimate, measured, ESTIMATE_FACTOR)
