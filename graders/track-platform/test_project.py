from infracourse.grading.project import test_environment_pinned, test_run_command, test_project_plan, test_bottleneck_evidence, test_project_report  # noqa: F401
