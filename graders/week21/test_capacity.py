"""Capacity: the rate capacity.json claims holds the SLO when the judge runs it again (at 0.9x, a margin for a
shared machine) and breaks it at 1.15x: the claim is within about 15 % of the real ceiling."""
import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit import platform_service as ps
from infracourse.kit.loadgen import serving_cost
from week21_judging import CAPACITY_ABOVE, CAPACITY_BELOW, check_outputs

SLO = f"TTFT <= {ps.CAPACITY_SLO_MS['ttft']:g} ms and TPOT <= {ps.CAPACITY_SLO_MS['tpot']:g} ms"


@pytest.mark.check("capacity-reproduced")
def test_capacity_reproduced(graded, judge_model, record):
    c = graded.phases["capacity"].get()
    claimed, below, above = c["claimed"], c["below"], c["above"]
    check_outputs(judge_model, below["specs"], below["records"], "the capacity rerun")
    m = below["metrics"]
    if below["good_fraction"] < ps.CAPACITY_GOODPUT_FRACTION:
        raise LabCheckFailed(
            f"capacity.json claims {claimed:.3g} requests/s; the judge ran {below['n']} requests at "
            f"{CAPACITY_BELOW:g}x that ({below['rate']:.3g}/s, gamma arrivals, burstiness "
            f"{ps.CAPACITY_BURSTINESS:g}) and only {below['good_fraction']:.1%} met {SLO} ({m['failed']} failed, P99 "
            f"TTFT {m['ttft_ms']['p99']:.0f} ms, P99 TPOT {m['tpot_ms']['p99']:.0f} ms), {ps.CAPACITY_GOODPUT_FRACTION:.0%} "
            "needed. The claim is above what the platform holds: the sweep must report the highest rate whose run "
            "kept 99 % within the SLO, measured, not extrapolated")
    if above["good_fraction"] >= ps.CAPACITY_GOODPUT_FRACTION:
        raise LabCheckFailed(
            f"capacity.json claims {claimed:.3g} requests/s, but the judge ran {above['n']} requests at "
            f"{CAPACITY_ABOVE:g}x that ({above['rate']:.3g}/s) and {above['good_fraction']:.1%} still met {SLO}: "
            "the claim is not the highest rate the SLO holds at. Sweep upward in steps of at most 5 % until the "
            "goodput fraction falls under 99 %, and report the last rate before it")
    cost = serving_cost(m, ps.DEVICE_PRICE_PER_HOUR)
    record("capacity", claimed, unit="requests/s")
    record("goodput fraction", below["good_fraction"], unit="")
    record("usd per 1k requests", cost["usd_per_1k_requests"], unit="USD")
    record("ttft p99", m["ttft_ms"]["p99"], unit="ms")
    record("tpot p99", m["tpot_ms"]["p99"], unit="ms")
