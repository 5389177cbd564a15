"""The checks labs share (grading.shared) come from lab.yaml, not from grader files: a weekly lab with a report
gets the report check, a track's project its five project checks; the grading plugin collects them beside the
week's own graders, and `dev check` counts them."""
from __future__ import annotations

import pytest

from infracourse.dev import static_problems
from infracourse.grading import project, report_check
from infracourse.grading.runner import grade
from infracourse.grading.shared import shared_module, shared_tests
from infracourse.hardware import detect

from minicourse import make_course

PROBE = "def answer():\n    return 42\n"
ANSWERS = '  - id: answers\n    title: "answers 42"\n'
REPORT = '  - id: report\n    title: "report.md complete"\n    kind: report\n'
GRADER = ('import pytest\n\n\n@pytest.mark.check("answers")\ndef test_answers(learner):\n'
          '    assert learner.module("probe").answer() == 42\n')


def test_a_weekly_lab_gets_the_report_check_and_a_project_the_five(course):
    assert shared_tests(course.lab("week07").spec) == {"report": report_check.test_report}
    staged = course.lab("week22", track="nvidia").spec
    assert shared_module(staged) is project
    assert shared_tests(staged) == {"environment-pinned": project.test_environment_pinned,
                                    "run-command": project.test_run_command,
                                    "project-plan": project.test_project_plan,
                                    "bottleneck-evidence": project.test_bottleneck_evidence,
                                    "report": project.test_project_report}


def _course_with_report(tmp_path, graders: str):
    course = make_course(tmp_path / "course", ANSWERS + REPORT, graders, "answers")
    lab_yaml = course.root / "labs" / "week01-probe" / "lab.yaml"
    lab_yaml.write_text(lab_yaml.read_text().replace("files: [probe.py]", "files: [probe.py, report.md]")
                        + "report:\n  file: report.md\n")
    for side in ("starter", "solution"):
        (course.root / "labs" / "week01-probe" / side / "report.md").write_text("## Question and hypothesis\n")
    return course


@pytest.fixture(scope="module")
def machine():
    return detect()


def test_the_report_check_is_collected_from_lab_yaml_and_run(tmp_path, machine):
    """No grader file names the report check; the plugin collects it because lab.yaml has a report, and it runs
    with that spec: a learner without report.md fails it, naming the file."""
    course = _course_with_report(tmp_path, GRADER)
    assert shared_tests(course.lab("week01").spec) == {"report": report_check.test_report}
    assert static_problems(course, course.lab("week01")) == []  # dev check: the report check has its test
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "probe.py").write_text(PROBE)
    checks = {c.id: c for c in grade(course, "week01", learner, hardware=machine).checks}
    assert checks["answers"].status == "passed", checks["answers"].message
    assert checks["report"].status == "failed" and "report.md is missing" in checks["report"].message, \
        (checks["report"].status, checks["report"].message)


def test_a_grader_of_its_own_for_a_shared_check_is_refused(tmp_path, machine):
    """Two tests would decide the report check (the runner keeps the first verdict): dev check names it, and a
    grade errors instead of passing."""
    own = GRADER + '\n\n@pytest.mark.check("report")\ndef test_report_again(learner):\n    pass\n'
    course = _course_with_report(tmp_path, own)
    problems = "\n".join(static_problems(course, course.lab("week01")))
    assert "tests decide checks ['report'], which the shared checks" in problems, problems
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "probe.py").write_text(PROBE)
    report = {c.id: c for c in grade(course, "week01", learner, hardware=machine).checks}["report"]
    assert report.status == "error" and "one test per check" in report.message, (report.status, report.message)
