from infracourse.grading.report_check import test_report  # noqa: F401
