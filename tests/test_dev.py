"""`infracourse dev check` finds what a course author must not ship."""
import shutil

import pytest

from infracourse.course import Course
from infracourse.dev import check_course

from conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "course"


@pytest.mark.solutions  # a learner release has no solution/ folders for the static checks to find
def test_every_real_lab_passes_the_static_checks(course):
    assert check_course(course, grade=False) == []


def test_fixture_course_passes_including_grading():
    assert check_course(Course(FIXTURE)) == []


def test_broken_course_is_reported_with_fixes(tmp_path):
    root = tmp_path / "course"
    shutil.copytree(FIXTURE, root)
    lab = root / "labs" / "week01-probe"
    (lab / "solution" / "__pycache__").mkdir()
    (lab / "solution" / "__pycache__" / "probe.cpython-311.pyc").write_bytes(b"x")
    (lab / "solution" / "extra.py").write_text("")
    shutil.copy(lab / "solution" / "probe.py", lab / "starter" / "probe.py")  # starter already solved
    problems = "\n".join(check_course(Course(root)))
    assert "stray files" in problems
    assert "only in solution" in problems and "'extra.py'" in problems
    assert "the untouched starter completes the week" in problems
    grader = root / "graders" / "week01" / "test_probe.py"
    grader.write_text(grader.read_text().replace('check("survives")', 'check("survive")'))
    problems = "\n".join(check_course(Course(root), grade=False))
    assert "no grader test for checks ['survives']" in problems
    assert "checks ['survive'] that lab.yaml does not define" in problems
