"""Week 8 report: filled per the weekly loop, and saying what this block's acceptance asks for."""
import pytest

from infracourse.grading.report import SYNC_STATED, check_report

REQUIRED = {
    "Method": SYNC_STATED,
    "Correctness criterion": (r"\d(\.\d+)?e-?\d|toleran", "the tolerance each dtype is held to"),
    "Results": (r"\|.*\d.*\|", "a table of maximum error and post-warm-up time per shape and dtype (a Markdown "
                "table with numbers)"),
    "Conclusion and limits": (
        r"(gain|faster|win|beat)[\s\S]*(regress|slower|loss|lose)|(regress|slower|loss|lose)[\s\S]*(gain|faster|win|beat)",
        "one shape range where your kernel beats torch.softmax and one where it loses, with the reason"),
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)
