"""Week 23: what the learner's norm does, measured separately at the operator and at the training step, and the
learner's end-to-end claim held to the bound Amdahl's law sets with the judge's own share and speed-up."""
import pytest

from infracourse.grader import LabCheckFailed, read_figures
from infracourse.kit import hotspot

# Accepted excess of a claim over the Amdahl bound: a CPU shared with other work times a few-millisecond step
# less steadily than a GPU's events time a kernel.
SLACK = {"cpu": 0.10, "cuda": 0.05}


@pytest.mark.check("hotspot-effect")
def test_hotspot_effect(baseline, effect, size, record):
    rows, cols = size.norm_shape
    record("operator speed-up", effect.operator_speedup, unit="x", seconds=effect.norm_s,
           reference_seconds=effect.unfused_norm_s, reference="kit.gpt.RMSNorm (unfused)",
           label=f"rms_norm forward + backward {rows}x{cols}")
    record("end-to-end speed-up", effect.end_to_end, unit="x", seconds=effect.step_s,
           reference_seconds=effect.baseline_step_s, reference="the course GPT with its own norm",
           label="training step")
    record("Amdahl bound", hotspot.amdahl_bound(baseline.share, effect.operator_speedup), unit="x")
    record("launches per step with your norm", effect.step.launches, unit="launches",
           reference=f"{baseline.step.launches} with the unfused norm")
    record("copies per step with your norm", effect.step.copies, unit="copies",
           reference=f"{baseline.step.copies} with the unfused norm")


@pytest.mark.check("amdahl-claim")
def test_amdahl_claim(learner, baseline, effect, device, record):
    path = learner.path("report.md")
    if not path.exists():
        raise LabCheckFailed("report.md is missing: your end-to-end claim is its figure end_to_end_speedup")
    claim = read_figures(path.read_text(encoding="utf-8"), "report.md").get("end_to_end_speedup")
    if claim is None:
        raise LabCheckFailed("report.md's figures block has no end_to_end_speedup yet: write the step speed-up your "
                             "run measured (baseline step time / step time with your norm)")
    s, k = baseline.share, effect.operator_speedup
    bound = hotspot.amdahl_bound(s, k)
    slack = SLACK["cuda" if str(device).startswith("cuda") else "cpu"]
    record("end-to-end claim", claim, target=bound * (1 + slack), unit="x",
           reference=f"Amdahl with s = {s:.3f} and k = {k:.3g}x, plus {slack:.0%}")
    if claim > bound * (1 + slack):
        raise LabCheckFailed(
            f"report.md claims an end-to-end speed-up of {claim:.3g}x, but the grader measured the norm at a share "
            f"s = {s:.3f} of the baseline step and your operator k = {k:.3g}x faster: Amdahl allows at most "
            f"1 / ((1 - s) + s / k) = {bound:.3g}x (accepted up to {bound * (1 + slack):.3g}x). A step cannot gain "
            "more than its hotspot's share; re-measure both steps the same way (warm-up, same batches, the same "
            "statistic) and report what you measured")
