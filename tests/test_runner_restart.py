"""A judge restart keeps what the grade settled: after a check hangs (the runner kills its judge process and
grades the rest in a fresh one), the report check still compares the figures measured before the restart."""
import shutil

import pytest

from conftest import REPO, replace_once

from infracourse.course import Course
from infracourse.grading.report import stamp_environment
from infracourse.grading.runner import grade

pytestmark = pytest.mark.slow

HANG_LIMIT_S = 10  # raw-data's limit in this test (lab.yaml's is 120 s): the hang ends the first judge sooner


def test_figures_measured_before_a_judge_restart_reach_the_report_check(tmp_path, machine):
    course = Course(REPO)  # a Course of its own: its spec is changed below, the session's `course` is not
    lab = course.lab("week01")
    lab.spec.check("raw-data").timeout_s = HANG_LIMIT_S
    folder = tmp_path / "learner"
    shutil.copytree(lab.solution, folder)
    stamp_environment(folder / lab.spec.report, machine)
    # overhead (which measures the report's figures) runs first; raw-data's call of main() then never returns
    benchmark = folder / "benchmark.py"
    benchmark.write_text(replace_once("    n, reps, calls, levels = (20_000",
                                      "    while True:\n        pass\n    n, reps, calls, levels = (20_000")
                         (benchmark.read_text()))
    events = []
    result = grade(course, lab, folder, hardware=machine, on_event=events.append)  # a report grades the whole week
    checks = {c.id: c for c in result.checks}
    started = [e["check"] for e in events if e["event"] == "start"]
    assert started.index("overhead") < started.index("raw-data") < started.index("report"), started
    assert checks["overhead"].status == "passed", checks["overhead"].message
    assert checks["raw-data"].status == "error" and f"longer than {HANG_LIMIT_S} s" in checks["raw-data"].message
    report = checks["report"]
    assert report.status == "passed", report.message  # not "grade again": the earlier figures were there
    for name in ("loop_ns_per_element", "vectorised_ns_per_element"):  # compared with the first judge's figures
        assert report.figures[name].target == checks["overhead"].figures[name].target
