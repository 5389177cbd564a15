"""Week 5 report: filled per the weekly loop, with the resume evidence and one measured sync or copy."""
import pytest

from infracourse.grading.report import check_report

REQUIRED = {
    "Method": (r"determinis|set_num_threads|manual_seed",
               "the settings that make the runs reproducible (seeds, threads, deterministic algorithms)"),
    "Results": (r"\|.*\d.*\|", "a table of per-step losses of the uninterrupted and the resumed run"),
    "Conclusion and limits": (
        r"(?=[\s\S]*(\.item\(\)|synchroni[sz]|\.cpu\(\)|\bcop(y|ies)))(?=[\s\S]*\d\s*(ms|us|µs|%))",
        "one copy or synchronisation point in the loop (e.g. loss.item()) and its measured cost (ms, us or %)"),
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)
