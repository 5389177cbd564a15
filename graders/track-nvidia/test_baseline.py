"""Week 22: the baseline. The judge measures the course GPT's training step with its own unfused norm (course
code, here): the norm's share of the step, the step's kernel launches and copies. The learner's own run
(raw/baseline.json) must have measured the same thing."""
import pytest

from infracourse.grader import LabCheckFailed
from track_nvidia_judging import number, read_raw


@pytest.mark.check("baseline-hotspot")
def test_baseline_hotspot(learner, baseline, size, device, record):
    record("norm share of the baseline step", baseline.share, unit="", calls_per_step=size.norms_per_step,
           seconds=baseline.step_s)
    record("launches per baseline step", baseline.step.launches, unit="launches")
    record("copies per baseline step", baseline.step.copies, unit="copies")
    record("norm launches per baseline step", size.norms_per_step * baseline.norm_call.launches, unit="launches")
    record("norm copies per baseline step", size.norms_per_step * baseline.norm_call.copies, unit="copies")
    yours = read_raw(learner, "baseline.json", device, size)
    share = number(yours, "norm_share", "baseline.json")
    if abs(share - baseline.share) > 0.1:
        raise LabCheckFailed(
            f"raw/baseline.json: norm_share {share:.3f}, the grader measured {baseline.share:.3f} "
            f"({size.norms_per_step} norms x {baseline.norm_s * 1e6:.0f} us forward + backward / "
            f"{baseline.step_s * 1e3:.2f} ms step; accepted 0.1 apart). Time one unfused norm's forward + backward "
            f"at the model's norm shape {size.norm_shape} and the whole step with the same harness, after warm-up")
    for key, ours in (("launches_per_step", baseline.step.launches), ("copies_per_step", baseline.step.copies)):
        mine = number(yours, key, "baseline.json")
        if abs(mine - ours) > max(2, 0.1 * ours):
            raise LabCheckFailed(
                f"raw/baseline.json: {key} {mine:g}, the grader counted {ours} in one baseline training step "
                f"({size.describe()}; accepted within 10 % or 2). Count the whole step (zero_grad, forward, "
                "backward, optimizer step) as kit.hotspot.count_call does: torch compute ops dispatched and "
                "copies, plus Triton launches")
