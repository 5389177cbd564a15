"""Week 9 report: filled per the weekly loop, with the error tolerances, a gain and a regression on the roofline."""
import pytest

from infracourse.grading.report import SYNC_STATED, check_report

REQUIRED = {
    "Method": SYNC_STATED,
    "Correctness criterion": [
        (r"tf32", "the error you accept for fp32 on tf32 tensor cores (allow_tf32 set)"),
        (r"ieee|full fp32|full precision", "the error you accept for fp32 without tf32 (ieee, torch's default)"),
    ],
    "Results": [
        (r"\|.*\d.*\|", "a table of error and TFLOP/s per shape (a Markdown table with numbers)"),
        (r"cublas|torch\.mm|torch\.matmul", "cuBLAS's (torch.mm's) figures beside yours"),
    ],
    "Conclusion and limits": [
        (r"regress|slower|loses|\bloss", "one shape where your kernel regresses against cuBLAS"),
        (r"\d+\s*(x|×|\*)\s*\d+", "that shape, named (e.g. 16x8192x8192)"),
        (r"roofline|intensity|memory-bound|compute-bound",
         "why, on the roofline: its arithmetic intensity and the roof (memory or compute) that bounds it"),
    ],
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)
