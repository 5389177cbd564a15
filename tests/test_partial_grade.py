"""A partial grade (`grade --check ID`, `-k PATTERN`): only the named checks and what they need run, and it
never passes a week, in the result, the progress database, result.json or `status`."""
import json
import shutil

import pytest
from typer.testing import CliRunner

from infracourse.cli import app
from infracourse.course import Course
from infracourse.grading.runner import grade
from infracourse.grading.selection import SelectionError, named_checks, with_prerequisites
from infracourse.workspace import Workspace

from conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "course"
WEEK07 = Course(REPO).lab("week07").spec


def test_named_checks_keep_lab_order_and_k_matches_like_pytest():
    assert named_checks(WEEK07) is None  # nothing named: the whole week
    assert named_checks(WEEK07, ["masks", "add-correct"]) == ["add-correct", "masks"]
    assert named_checks(WEEK07, pattern="reduce and not bandwidth") == ["reduce-correct", "reduce-accuracy"]
    assert named_checks(WEEK07, ["masks"], pattern="ADD-C") == ["add-correct", "masks"]


@pytest.mark.parametrize("ids, pattern, words", [
    (["add-corect"], None, ["'add-corect'", "add-correct", "lab.yaml", "--check"]),
    ([], "nothing", ["-k 'nothing' matches no check", "add-correct"]),
    ([], "add and (", ["not a pytest -k expression", "and / or / not"]),
])
def test_a_bad_selection_says_which_and_what_exists(ids, pattern, words):
    with pytest.raises(SelectionError) as caught:
        named_checks(WEEK07, ids, pattern)
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_check_brings_what_it_requires_and_a_report_the_checks_its_figures_name():
    assert with_prerequisites(WEEK07, ["add-correct"]) == ["add-correct"]
    assert with_prerequisites(WEEK07, ["add-bandwidth"]) == ["add-correct", "masks", "kernel-did-work", "add-large",
                                                              "add-bandwidth"]
    # week 1's report compares one figure, measured by `overhead`; week 4's only figures follow from its setup
    week01, week04 = Course(REPO).lab("week01").spec, Course(REPO).lab("week04").spec
    assert {f.check for f in week01.report.figures} == {"overhead"}
    assert with_prerequisites(week01, ["report"]) == ["overhead", "report"]
    assert with_prerequisites(week04, ["report"]) == ["report"]
    # week 7's figures are its two bandwidths: they bring what those require, not the whole week
    assert "reduce-bandwidth" in with_prerequisites(WEEK07, ["report"])
    assert set(with_prerequisites(WEEK07, ["report"])) < {c.id for c in WEEK07.checks}


def test_a_check_this_machine_blocks_brings_nothing():
    """Blocked whatever its requires say, and a report does not compare its figures: on a CPU, week 7's report
    grades itself and its two (blocked) bandwidths, not the kernels' correctness checks."""
    def on_cpu(check):
        return check.needs != "cpu"

    assert with_prerequisites(WEEK07, ["add-bandwidth"], blocked=on_cpu) == ["add-bandwidth"]
    assert with_prerequisites(WEEK07, ["report"], blocked=on_cpu) == ["add-bandwidth", "reduce-bandwidth", "report"]
    assert with_prerequisites(WEEK07, ["add-correct"], blocked=on_cpu) == ["add-correct"]


def test_a_track_projects_report_brings_the_whole_week():
    """Its to_be_verified list must name exactly the checks blocked here: it reads every check's status."""
    project = Course(REPO).lab("week24", track="nvidia").spec
    assert with_prerequisites(project, ["report"]) == [c.id for c in project.checks]


def test_the_runner_grades_only_the_selection_and_the_result_is_partial(tmp_path, machine):
    folder = tmp_path / "learner"
    shutil.copytree(FIXTURE / "labs" / "week01-probe" / "solution", folder)
    result = grade(Course(FIXTURE), "week01", folder, hardware=machine, checks=["fast"])
    assert [c.id for c in result.checks] == ["answers", "fast"]
    assert all(c.status == "passed" for c in result.checks), [(c.id, c.message) for c in result.checks]
    assert result.partial and result.all_passed and not result.complete and not result.verified_on_gpu
    whole = grade(Course(FIXTURE), "week01", folder, hardware=machine)
    assert not whole.partial and whole.complete and len(whole.checks) == 4


def invoke(*args, ws):
    env = {"INFRACOURSE_WORKSPACE": str(ws), "INFRACOURSE_COURSE": str(FIXTURE)}
    return CliRunner().invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)


def _week01(ws) -> dict:
    return next(w for w in json.loads(invoke("status", "--json", ws=ws).output)["weeks"] if w["week"] == "week01")


def test_a_partial_grade_never_passes_the_week(tmp_path, machine):
    if machine.gpu_count:
        pytest.skip("the fixture course's on-gpu check must be blocked here")
    ws = Workspace.init(tmp_path / "ws")
    ws.unlock(Course(FIXTURE), Course(FIXTURE).week("week01"))
    shutil.copy(FIXTURE / "labs" / "week01-probe" / "solution" / "probe.py", ws.root / "week01" / "probe.py")

    partial = invoke("grade", "week01", "--check", "fast", ws=ws.root)
    assert partial.exit_code == 0, partial.output  # every check graded passed
    shown = " ".join(partial.output.split())  # as read, whatever the terminal's width
    assert "partial grade of 2 check(s): 2 passed" in shown and "never completes the week" in shown
    assert "complete" not in shown.replace("never completes", ""), shown
    assert _week01(ws.root)["state"] == "unlocked" and _week01(ws.root)["last_grade"] is None
    assert not (ws.root / "week01" / ".grade" / "result.json").exists()  # kept for whole grades only

    assert invoke("grade", "week01", ws=ws.root).exit_code == 0
    (ws.root / "week01" / "probe.py").write_text("def answer():\n    return 41\n\n\ndef survive():\n    return True\n")
    failing = invoke("grade", "week01", "-k", "answers", ws=ws.root)
    assert failing.exit_code == 1 and "answers" in failing.output
    week = _week01(ws.root)
    assert week["state"] == "passed" and week["last_grade"]["complete"] and week["last_grade"]["checks"] == 4
    stored = json.loads((ws.root / "week01" / ".grade" / "result.json").read_text())
    assert stored["complete"] and not stored["partial"]  # the whole grade, not the partial one after it
    assert Workspace(ws.root).progress.weeks_summary()["week01"]["attempts"] == 3


def test_an_unknown_check_is_one_line_naming_the_known_ones(tmp_path):
    ws = Workspace.init(tmp_path / "ws")
    ws.unlock(Course(FIXTURE), Course(FIXTURE).week("week01"))
    out = invoke("grade", "week01", "--check", "answer", ws=ws.root)
    assert out.exit_code == 2 and "week01 has no check 'answer'" in out.output and "answers" in out.output
