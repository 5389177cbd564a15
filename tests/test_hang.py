"""A hang is paid once: after a learner function overruns one check's limit, later checks that call it fail
fast (saying why) instead of each waiting out its own limit."""
import shutil
import time
from pathlib import Path

from infracourse.course import Course
from infracourse.grading.runner import grade

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "course"
LIMIT_S = 8
CHECKS = ["first", "second", "third"]


def _course_of_three_checks(root: Path) -> Course:
    """The fixture course, with a week whose three checks each call probe.answer()."""
    shutil.copytree(FIXTURE, root)
    lab = root / "labs" / "week01-probe"
    lab.joinpath("lab.yaml").write_text(
        "format_version: 1\nweek: week01\ntitle: \"three calls\"\nfiles: [probe.py]\nhints: [\"return 42\"]\n"
        "checks:\n" + "".join(f"  - {{id: {c}, title: \"{c} call\", timeout_s: {LIMIT_S}}}\n" for c in CHECKS))
    tests = "import pytest\n\n\n" + "".join(
        f"@pytest.mark.check(\"{c}\")\ndef test_{c}(learner):\n    assert learner.module(\"probe\").answer() == 42\n\n\n"
        for c in CHECKS)
    graders = root / "graders" / "week01"
    shutil.rmtree(graders)
    graders.mkdir()
    (graders / "test_calls.py").write_text(tests)
    syllabus = root / "curriculum" / "syllabus.yaml"
    syllabus.write_text(syllabus.read_text().replace("checks: [answers]", "checks: [first]"))
    return Course(root)


def test_a_function_that_never_returns_costs_one_limit(tmp_path, machine):
    course = _course_of_three_checks(tmp_path / "course")
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "probe.py").write_text("def answer():\n    while True:\n        pass\n")
    t0 = time.monotonic()
    result = grade(course, "week01", learner, hardware=machine)
    elapsed = time.monotonic() - t0
    checks = {c.id: c for c in result.checks}
    assert checks["first"].status == "error" and "inside probe.answer()" in checks["first"].message
    for later in CHECKS[1:]:
        assert checks[later].status == "error"
        assert "did not return within an earlier check's time limit" in checks[later].message
    assert elapsed < 2 * LIMIT_S + 40, elapsed  # one limit, plus a judge and worker start-up each
