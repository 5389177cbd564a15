"""Week 7 report: filled per the weekly loop, and saying what this block's acceptance asks for."""
import pytest

from infracourse.grading.report import SYNC_STATED, check_report

REQUIRED = {
    "Method": SYNC_STATED,
    "Results": (r"\|.*\d.*\|", "a table of error and post-warm-up time per shape (a Markdown table with numbers)"),
    "Conclusion and limits": (
        r"(gain|faster|win)[\s\S]*(regress|slower|loss)|(regress|slower|loss)[\s\S]*(gain|faster|win)",
        "one shape where your kernel gains and one where it regresses, with the reason"),
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)
