"""Week 4 report: filled per the weekly loop, showing one copy or sync point in a profile of a training step."""
import pytest

from infracourse.grading.report import check_report

REQUIRED = {
    "Results": (r"aten::\w+.*\d", "the profiler rows (aten::... with their counts or times) that show the copy or "
                "synchronisation point"),
    "Conclusion and limits": (r"\bcop(y|ies)\b|synchroni[sz]|\.item\(\)",
                              "which copy or synchronisation point it is and why the code causes it"),
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)
