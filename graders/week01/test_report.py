"""Week 1 report: filled per the weekly loop, stating warm-up, repetitions, timing scope, synchronisation and
the percentile method, with a results table and the dominant cost named."""
import pytest

from infracourse.grading.report import check_report

RULES = [  # (section, (pattern, what it must state)), checked in order
    ("Method", (r"warm-?up\D{0,60}\d|\d+\s+warm-?up", "the number of warm-up calls")),
    ("Method", (r"(repetitions?|reps|repeats|timed calls)\D{0,60}\d|\d+\s+(repetitions|reps|repeats|timed calls)",
                "the number of repetitions")),
    ("Method", (r"scope|timed region|inside the (timer|clock)", "the timing scope: what lies inside the timer")),
    ("Method", (r"synchroni[sz]|wait\(\)", "how asynchronous work is waited for before the clock is read")),
    ("Method", (r"linear|interpolat", "the percentile method (linear interpolation between ranks)")),
    ("Results", (r"\|.*\d.*\|", "a table of your measurements (a Markdown table with numbers)")),
    ("Conclusion and limits", (r"domina|bottleneck|most of the time|overhead",
                               "which cost dominates in the code you measured, with the numbers that show it")),
]


@pytest.mark.check("report")
def test_report(learner, hardware):
    for section, rule in RULES:
        check_report(learner.path("report.md"), hardware, required={section: rule})
