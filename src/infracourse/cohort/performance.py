"""Performance relative to the device it was measured on, so an H100 and a laptop GPU compare fairly.

A kernel lab's performance check records its achieved rate with the ceiling it was judged against
(`grading.perf.require_fraction` stores `ceiling` and `fraction_of_ceiling`). That fraction is the fair
number: the learner's rate over what *their* device can do. Figures recorded without it are divided by the
matching calibrated ceiling carried in the bundle (copy bandwidth for GB/s, the best matmul rate for
TFLOP/s); anything else has no fair comparison and is shown raw only.

Leaderboards rank regraded figures only (`score`): a self-reported figure is shown, marked self-reported,
but a learner's machine can claim anything.
"""
from __future__ import annotations

from infracourse.course import LabDir
from infracourse.grading.results import Figure

MEASURED = ("passed", "failed")  # a performance figure counts only when correctness let it be measured


def normalised(figure: Figure, ceilings: dict | None) -> float | None:
    """The figure as a fraction of the ceiling of the device that measured it (None when there is none)."""
    if figure.fraction_of_ceiling is not None:
        return figure.fraction_of_ceiling
    value, unit = figure.value, figure.unit
    if not ceilings:
        return None
    if unit == "GB/s" and _number(ceilings.get("copy_gbps")) and ceilings["copy_gbps"] > 0:
        return value / ceilings["copy_gbps"]
    rates = [r for r in (ceilings.get("matmul_tflops") or {}).values() if _number(r) and r > 0]
    if unit == "TFLOP/s" and rates:
        return value / max(rates)
    return None


def performance_checks(lab: LabDir) -> list[str]:
    """A kernel week is one with performance checks; these are what its leaderboard ranks."""
    return [c.id for c in lab.spec.checks if c.kind == "performance"]


def score(best: dict, checks: list[str]) -> float | None:
    """Mean fraction of ceiling over a week's performance checks, from regraded figures only (`best`: check
    id -> a figure with `.origin` and `.normalised`); a check never measured here counts 0. A self-reported
    figure is a claim the learner's machine made and never ranks; None when nothing was regraded."""
    verified = {c: f.normalised for c, f in best.items() if f.origin == "verified" and f.normalised is not None}
    if not checks or not verified:
        return None
    return sum(verified.get(c, 0.0) for c in checks) / len(checks)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
