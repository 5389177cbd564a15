"""Week 10 report: the operator's speed-up and the training step's change, stated apart and linked by the
norm's share of the step (the seed's warning: an operator's gain is not the model's)."""
import pytest

from infracourse.grading.report import check_report

REQUIRED = {
    "Method": (r"synchroni[sz]e|cuda\.Event|elapsed_time|do_bench|measure\(",
               "how the device is synchronised around the timed region (events, torch.cuda.synchronize, ...)"),
    "Results": (r"(?=[\s\S]*\|.*\d.*\|)(?=[\s\S]*(operator|kernel)[^\n]*\d)"
                r"(?=[\s\S]*(end-to-end|training step|step time)[^\n]*\d)",
                "a table with numbers, and on their own lines the operator's speed-up and the end-to-end "
                "training-step change, each with its figure"),
    "Conclusion and limits": (
        r"(?=[\s\S]*(share|fraction|amdahl|hotspot))(?=[\s\S]*(gain|faster|speed-up|speedup))"
        r"(?=[\s\S]*(regress|slower|loss|overhead))",
        "one gain and one regression, and why the operator's speed-up did or did not carry over to the step: "
        "the norm's share of the step time (Amdahl), extra copies, launch overhead"),
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)
