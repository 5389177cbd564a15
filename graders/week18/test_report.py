"""The report check, as lab.yaml's `report:` section describes it: prose sections filled in the learner's own
words, this machine's environment, and the figures block compared with what this grade measured
(infracourse.grading.report_check)."""
from infracourse.grading.report_check import test_report  # noqa: F401 - collected here by pytest
