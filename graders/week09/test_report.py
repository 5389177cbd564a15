"""Week 9 report: filled per the weekly loop, with the error tolerances, a gain and a regression on the roofline."""
import pytest

from infracourse.grading.report import check_report

SHAPE = r"\d+\s*(x|×|\*)\s*\d+"
REQUIRED = {
    "Method": (r"synchroni[sz]e|cuda\.Event|elapsed_time|do_bench|measure\(",
               "how the device is synchronised around the timed region (events, torch.cuda.synchronize, ...)"),
    "Correctness criterion": (r"tf32[\s\S]*ieee|ieee[\s\S]*tf32",
                              "the error you accept for fp32 with tf32 tensor cores and without them (ieee)"),
    "Results": (r"\|.*\d.*\|[\s\S]*(cublas|torch\.mm|torch\.matmul)|(cublas|torch\.mm|torch\.matmul)[\s\S]*\|.*\d.*\|",
                "a table of error and TFLOP/s per shape with cuBLAS (torch.mm) beside it"),
    "Conclusion and limits": (
        rf"(?=[\s\S]*(regress|slower|loses|loss))(?=[\s\S]*{SHAPE})"
        r"(?=[\s\S]*(roofline|intensity|memory-bound|compute-bound))",
        "one shape where the kernel regresses (name it, e.g. 16x8192x8192) and why, placed on the roofline "
        "(arithmetic intensity, memory- or compute-bound)"),
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)
