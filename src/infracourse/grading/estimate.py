"""Estimate before you measure (003 §9): the `estimate` check kind.

The learner writes the formula for a number (KV-cache bytes, ZeRO memory, ring bytes, pipeline bubble, MFU, cost per
request) as a function; an estimate check first compares that function with the course's reference on several
configurations the learner did not choose (the formula, not one number), then compares the estimate for the
measured configuration with what the judge measured (the model of the system, against the system). Both steps fail
naming the configuration, the two numbers and what to look at.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from infracourse.failures import LabCheckFailed, WrongOutput


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WrongOutput(f"{what} returned {value!r}: return one finite number")
    return float(value)


def _show(case: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in case.items())


def check_formula(name: str, learner_fn: Callable, reference_fn: Callable, cases: Iterable[dict], *,
                  rel: float = 1e-6) -> list[float]:
    """The learner's formula equals the reference on every case (kwargs dicts): exactly where the reference gives
    an integer, within `rel` otherwise. Returns the learner's values."""
    values = []
    for case in cases:
        want = reference_fn(**case)
        got = _number(learner_fn(**case), f"{name}({_show(case)})")
        exact = isinstance(want, int) and not isinstance(want, bool)  # counts (bytes, tokens) are exact
        if (got != want) if exact else not math.isclose(got, want, rel_tol=rel, abs_tol=1e-12):
            raise WrongOutput(f"{name}({_show(case)}) = {got:.6g}, but the formula gives {float(want):.6g}. Write the "
                              "estimate from the configuration alone (count every term: each tensor, each direction, "
                              "each rank), before measuring")
        values.append(got)
    return values


def check_measured(name: str, estimate: float, measured: float, factor: float, *, absolute: float = 0.0,
                   what: str = "") -> float:
    """The judge's measurement lies within `factor` (either side) of the estimate, or `absolute` of it. Returns
    measured / estimate."""
    estimate = _number(estimate, name)
    if abs(measured - estimate) <= absolute:
        return measured / estimate if estimate else 1.0
    if estimate <= 0 or measured <= 0 or max(measured / estimate, estimate / measured) > factor:
        raise LabCheckFailed(f"{name}: your estimate {estimate:.6g} and the judge's measurement {measured:.6g}"
                             f"{' (' + what + ')' if what else ''} differ by more than {factor:g}x: either the "
                             "formula leaves out a term the system pays, or the measurement is of something else "
                             "(say which in your report)")
    return measured / estimate
