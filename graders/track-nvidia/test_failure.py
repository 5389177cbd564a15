"""Week 24: the failure case. raw/failure.json names a shape where the learner's run measured its operator
slower than the unfused norm; the judge measures that shape again, forward + backward, outputs checked."""
import pytest
import torch

from infracourse.grader import LabCheckFailed
from track_nvidia_judging import number, operator_race, read_raw

MAX_ELEMENTS = {"cpu": 1 << 21, "cuda": 1 << 28}  # what the grader re-measures in seconds on each device
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SLOWER = 1.0  # a failure case is a shape where the operator loses: below 1x, as recorded and as re-measured
AGREE = 1.5   # the run's recorded speed-up and the grader's, at most this ratio apart: a case really measured


@pytest.mark.timing  # a verdict from a timing: measured a second time before it fails
@pytest.mark.check("failure-case")
def test_failure_case(norm, learner, size, device, record, seed):
    data = read_raw(learner, "failure.json", device, size)
    case = data.get("regression")
    if not isinstance(case, dict):
        raise LabCheckFailed("raw/failure.json has no `regression`: name the measured case where your operator was "
                             "slower, {\"rows\": R, \"cols\": C, \"dtype\": \"float32\", \"speedup\": x (< 1)}")
    rows, cols = int(number(case, "rows", "failure.json")), int(number(case, "cols", "failure.json"))
    dtype = DTYPES.get(case.get("dtype"))
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    if dtype is None or rows < 1 or cols < 1 or rows * cols > MAX_ELEMENTS[kind]:
        raise LabCheckFailed(f"raw/failure.json's regression ({rows}, {cols}) {case.get('dtype')!r}: the grader "
                             f"re-measures float32 or bfloat16 shapes of at most {MAX_ELEMENTS[kind]} elements on "
                             f"{kind}")
    claimed = number(case, "speedup", "failure.json")
    if claimed >= SLOWER:
        raise LabCheckFailed(f"raw/failure.json's regression at ({rows}, {cols}) has speedup {claimed:.3g}: a failure "
                             "case is a shape where your operator is slower (below 1x). Measure a few shapes (one "
                             "tiny row, very narrow rows, ...) and name the one where it loses")
    mine, unfused = operator_race(norm, learner, rows, cols, dtype, device, seed)
    speedup = unfused / mine
    record("speed-up at the failure shape", speedup, target=SLOWER, unit="x", seconds=mine,
           reference_seconds=unfused, reference="kit.gpt.RMSNorm (unfused)",
           label=f"rms_norm forward + backward {rows}x{cols} {case['dtype']} (your run: {claimed:.3g}x)")
    if speedup >= SLOWER:
        raise LabCheckFailed(
            f"raw/failure.json says your operator is {claimed:.3g}x the unfused norm's speed at ({rows}, {cols}) "
            f"{case['dtype']}, but the grader measured {speedup:.3g}x there (yours {mine * 1e6:.0f} us, "
            f"unfused {unfused * 1e6:.0f} us, forward + backward): not a regression on this machine. Record a case "
            "your run really measured here")
    if max(claimed / speedup, speedup / claimed) > AGREE:
        raise LabCheckFailed(
            f"raw/failure.json records {claimed:.3g}x at ({rows}, {cols}) {case['dtype']}, the grader measured "
            f"{speedup:.3g}x there (accepted {AGREE:g}x apart): the record is not what this machine measures. Keep "
            "the numbers your run printed, measured the way the grader measures (see the handout)")
