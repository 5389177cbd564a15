"""Week 10 report: the operator's speed-up and the training step's change, stated apart and linked by the
norm's share of the step (the seed's warning: an operator's gain is not the model's)."""
import pytest

from infracourse.grading.report import SYNC_STATED, check_report

REQUIRED = {
    "Method": SYNC_STATED,
    "Results": [
        (r"\|.*\d.*\|", "a table of error and time per shape (a Markdown table with numbers)"),
        (r"(operator|kernel)[^\n]*\d", "the operator's speed-up, on its own line with its figure"),
        (r"(end-to-end|training step|step time)[^\n]*\d",
         "the end-to-end training-step change, on its own line with its figure"),
    ],
    "Conclusion and limits": [
        (r"gain|faster|speed-?up", "one gain"),
        (r"regress|slower|\bloss|overhead", "one regression"),
        (r"share|fraction|amdahl|hotspot",
         "why the operator's speed-up did or did not carry over to the step: the norm's share of the step time "
         "(Amdahl), extra copies, launch overhead"),
    ],
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)
