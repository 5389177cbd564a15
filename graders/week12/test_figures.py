"""The report's derived figures follow from its own primary ones: relations that hold at any load.

The report's timings are compared with this grade's re-measurement only within 5x (a shared machine moves a
launch's step 3.5x between grades), so a derived figure off by 2-3x would pass that comparison: an MFU from the
forward FLOPs alone (3x low), one rank's samples/s reported as the world's (2x low), an efficiency or an overlap
gain that does not follow from the timings beside it. Here each derived figure is recomputed from the report's
own step times and calibrated peak, exactly (2 % for rounding), so a mistake in the formula fails whatever the
load."""
from __future__ import annotations

import pytest

from infracourse.grader import LabCheckFailed, read_figures
from infracourse.kit import ddp_reference as ref
from week12_judging import STRONG_GLOBAL

REPORT = "report.md"
ROUNDING = 0.02  # relative: the block rounds each figure to 3-4 digits


def relations(f: dict[str, float]) -> list[tuple[str, str, float, str]]:
    """(figure, its value, what the relation gives, the relation in words) for each derived figure."""
    t2 = f["step_ms"] / 1e3
    flops = ref.flops_per_sample() * f["global_batch"]
    return [
        ("samples_per_s", f["samples_per_s"], f["global_batch"] / t2,
         "samples/s x step time = global batch (every rank's samples, not one rank's)"),
        ("mfu", f["mfu"], flops / (t2 * 2 * f["peak_gflops"] * 1e9),
         f"MFU = flops_per_sample() ({ref.flops_per_sample()}: 6 per multiply-add, forward AND backward) x global "
         "batch / (step time x 2 ranks x peak_gflops)"),
        ("strong_efficiency", f["strong_efficiency"], f["t1_strong_ms"] / (2 * f["step_ms"]),
         "strong efficiency = T1 / (N x T2) at the same global batch: t1_strong_ms / (2 x step_ms)"),
        ("weak_efficiency", f["weak_efficiency"], f["t1_weak_ms"] / f["step_ms"],
         "weak efficiency = T1 / T2 at the same per-rank batch: t1_weak_ms / step_ms"),
        ("overlap_gain", f["overlap_gain"], f["no_overlap_step_ms"] / f["overlap_step_ms"],
         "what overlap bought = the step without overlap / the overlapped step: no_overlap_step_ms / "
         "overlap_step_ms"),
    ]


NEEDED = ("global_batch", "step_ms", "samples_per_s", "mfu", "peak_gflops", "t1_strong_ms", "t1_weak_ms",
          "strong_efficiency", "weak_efficiency", "overlap_step_ms", "no_overlap_step_ms", "overlap_gain")


@pytest.mark.check("figures-follow")
def test_derived_figures_follow_from_the_timings(learner, record):
    path = learner.path(REPORT)
    if not path.exists():
        raise LabCheckFailed(f"{REPORT} is missing: copy the template back with `infracourse reset` and fill its "
                             "figures block")
    figures = read_figures(path.read_text(encoding="utf-8"), REPORT)
    missing = [name for name in NEEDED if name not in figures]
    if missing:
        raise LabCheckFailed(f"{REPORT}'s figures block lacks {missing}: the template lists each, with its unit")
    if figures["global_batch"] != STRONG_GLOBAL:
        raise LabCheckFailed(f"{REPORT}: global_batch is {figures['global_batch']:g}; the strong-scaling runs' "
                             f"global batch is per-rank batch x accumulation x world = {STRONG_GLOBAL}")
    for name in ("step_ms", "peak_gflops", "t1_strong_ms", "t1_weak_ms", "overlap_step_ms", "no_overlap_step_ms"):
        if figures[name] <= 0:
            raise LabCheckFailed(f"{REPORT}: {name} is {figures[name]:g}; a time or a rate is positive")
    found = list(relations(figures))
    for name, _, want, _ in found:  # all recorded first: `infracourse measure` writes them from this check
        record(f"{name} from the relation", want)
    for name, got, want, relation in found:
        if abs(got - want) > ROUNDING * abs(want):
            raise LabCheckFailed(
                f"{REPORT}: {name} = {got:.4g}, but the block's own figures give {want:.4g} by the relation "
                f"{relation}, which holds whatever the machine's load (accepted within {ROUNDING:.0%} for "
                "rounding). Recompute it from the figures beside it (`infracourse measure` writes the timings and "
                "then the figures that follow from them)")
