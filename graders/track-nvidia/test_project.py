"""The five checks every track's project shares (infracourse.grading.project): a pinned environment, the run
command run by the grader, the plan, the bottleneck evidence and the report."""
from infracourse.grading.project import test_environment_pinned, test_run_command, test_project_plan, test_bottleneck_evidence, test_project_report  # noqa: F401
