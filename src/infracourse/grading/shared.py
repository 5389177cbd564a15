"""The checks labs share, and which ones a lab gets: its lab.yaml says so, no grader file repeats it.

- A track's project (lab.yaml's `week: track-<id>`, graded in stages as week22..week24) gets the five checks
  every project shares (grading.project): environment-pinned, run-command, project-plan, bottleneck-evidence
  and report.
- Any other lab with a report (a `report:` section, or a check of kind `report`) gets the report check
  (grading.report_check), configured by that `report:` section.

The grading plugin collects these tests beside the week's own grader files, and `infracourse dev check` counts
them as the grader tests of their check ids. A check id is named once, by the test's `@pytest.mark.check`.
"""
from __future__ import annotations

from types import ModuleType
from typing import Callable

from infracourse.grading import project, report_check
from infracourse.syllabus import PROJECT_WEEKS, Lab

# Where the week's own grader file for the shared checks sorted among the graders before pytest collected them
# from here: they still run at that place, so the order checks run in is unchanged.
SORTS_AS = {project: "test_project.py", report_check: "test_report.py"}


def is_project(spec: Lab) -> bool:
    """A track's project: its lab.yaml (`week: track-<id>`) or that lab staged as a project week."""
    return spec.week.startswith("track-") or spec.week in PROJECT_WEEKS


def shared_module(spec: Lab) -> ModuleType | None:
    """The module holding the shared checks this lab gets, or None when it gets none."""
    if is_project(spec):
        return project
    if spec.report is not None or any(c.kind == "report" for c in spec.checks):
        return report_check
    return None


def shared_tests(spec: Lab) -> dict[str, Callable]:
    """Check id -> the shared test that decides it, for this lab (read from each test's `check` mark)."""
    module = shared_module(spec)
    if module is None:
        return {}
    return {mark.args[0]: test for name, test in vars(module).items() if name.startswith("test_") and callable(test)
            for mark in getattr(test, "pytestmark", []) if mark.name == "check" and mark.args}
