"""Week 3 report: utilisation and effective throughput both reported with numbers, the latency table, and
why a busy device can do little useful work."""
import pytest

from infracourse.grading.report import check_report

RULES = [  # (section, (pattern, what it must state)), checked in order
    ("Method", (r"warm-?up\D{0,60}\d|\d+\s+warm-?up", "the number of warm-up batches")),
    ("Method", (r"scope|timed region|inside the (timer|clock)", "the timing scope of utilisation and throughput")),
    ("Results", (r"utili[sz]ation[^\n]*\d", "the utilisation of both schemes, with numbers")),
    ("Results", (r"(useful|effective)[^\n]*\d", "the useful (effective) tokens per second of both schemes")),
    ("Results", (r"\|[^\n]*concurrency[^\n]*\|", "the latency / throughput / concurrency table (a Markdown table)")),
    ("Conclusion and limits", (r"padd[\s\S]*utili[sz]ation|utili[sz]ation[\s\S]*padd",
                               "why high utilisation did not mean high effective throughput (padding)")),
]


@pytest.mark.check("report")
def test_report(learner, hardware):
    for section, rule in RULES:
        check_report(learner.path("report.md"), hardware, required={section: rule})
