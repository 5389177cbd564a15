"""A hang is paid once: after a learner function overruns one check's limit, later checks that call it fail
fast (saying why) instead of each waiting out its own limit."""
import time
from pathlib import Path

from minicourse import make_course

from infracourse.grading.runner import grade
LIMIT_S = 8
CHECKS = ["first", "second", "third"]


def _course_of_three_checks(root: Path):
    checks = "".join(f"  - {{id: {c}, title: \"{c} call\", timeout_s: {LIMIT_S}}}\n" for c in CHECKS)
    graders = "import pytest\n\n\n" + "".join(
        f"@pytest.mark.check(\"{c}\")\ndef test_{c}(learner):\n    assert learner.module(\"probe\").answer() == 42\n\n\n"
        for c in CHECKS)
    return make_course(root, checks, graders, CHECKS[0])


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
