"""Week 2 report: warm-up, steps and the step's timing scope stated; a results table; the bottleneck named
with numbers, and a resource that was busy without helping."""
import pytest

from infracourse.grading.report import check_report

RULES = [  # (section, (pattern, what it must state)), checked in order
    ("Method", (r"warm-?up\D{0,60}\d|\d+\s+warm-?up", "the number of warm-up steps")),
    ("Method", (r"(steps|repetitions|reps)\D{0,60}\d|\d+\s+(timed )?(steps|repetitions|reps)",
                "the number of timed steps")),
    ("Method", (r"data wait[\s\S]*transfer[\s\S]*compute", "the timing scope: data wait, transfer and compute")),
    ("Results", (r"\|.*\d.*\|", "a table of the sweep (a Markdown table with numbers from results.csv)")),
    ("Conclusion and limits", (r"bottleneck[^\n]*\d|\d[^\n]*bottleneck", "the bottleneck, named with numbers")),
    ("Conclusion and limits", (r"(busy|\d+\s*%)[\s\S]*(not|no)\b[^.]*(rise|increase|improve|faster|help)",
                               "a resource that was busy while samples/s did not rise")),
]


@pytest.mark.check("report")
def test_report(learner, hardware):
    for section, rule in RULES:
        check_report(learner.path("report.md"), hardware, required={section: rule})
