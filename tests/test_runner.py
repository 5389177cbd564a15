"""The grading runner fails closed: crashes, hangs and import errors cost one check, never pass one."""
import pytest

from infracourse.course import Course
from infracourse.grading.runner import grade
from infracourse.hardware import detect

from conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "course"
GOOD = "def answer():\n    return 42\n\n\ndef survive():\n    return True\n"


@pytest.fixture(scope="module")
def cpu():
    hw = detect()
    if hw.gpu_count:
        pytest.skip("these tests expect the on-gpu check to be blocked")
    return hw


def run(tmp_path, cpu, source: str):
    folder = tmp_path / "learner"
    folder.mkdir(exist_ok=True)
    (folder / "probe.py").write_text(source)
    result = grade(Course(FIXTURE), "week01", folder, hardware=cpu)
    return result, {c.id: c for c in result.checks}


def test_good_submission_completes_with_gpu_check_blocked(tmp_path, cpu):
    result, checks = run(tmp_path, cpu, GOOD)
    assert [c.status for c in result.checks] == ["passed", "passed", "blocked", "passed"]
    assert "needs a CUDA GPU" in checks["on-gpu"].message
    assert result.complete and not result.verified_on_gpu


def test_segfault_is_an_error_of_that_check_only(tmp_path, cpu):
    crash = "import ctypes\n\ndef answer():\n    return 42\n\n\ndef survive():\n    ctypes.string_at(0)\n"
    result, checks = run(tmp_path, cpu, crash)
    assert checks["survives"].status == "error"
    assert "SIGSEGV" in checks["survives"].message
    assert checks["answers"].status == "passed" and checks["fast"].status == "passed"
    assert not result.complete


def test_infinite_loop_times_out_and_grading_goes_on(tmp_path, cpu):
    hang = "def answer():\n    return 42\n\n\ndef survive():\n    while True:\n        pass\n"
    result, checks = run(tmp_path, cpu, hang)
    assert checks["survives"].status == "error"
    assert "longer than 3 s" in checks["survives"].message
    assert checks["fast"].status == "passed"


def test_hard_exit_in_learner_code_is_an_error(tmp_path, cpu):
    result, checks = run(tmp_path, cpu, "import os\n\ndef answer():\n    os._exit(0)\n\n\ndef survive():\n    return True\n")
    assert checks["answers"].status == "error"
    assert checks["survives"].status == "passed"
    assert checks["fast"].status == "failed"  # answers did not pass, so no credit


def test_file_that_does_not_import_names_the_file_and_line(tmp_path, cpu):
    result, checks = run(tmp_path, cpu, "def answer(:\n    return 42\n")
    for check_id in ("answers", "survives"):
        assert checks[check_id].status == "error"
        assert "probe.py does not import" in checks[check_id].message
        assert "line 1" in checks[check_id].message


@pytest.mark.parametrize("helper, words", [
    ("def half(:\n    pass\n", ["helpers.py, which probe.py imports, does not import", "SyntaxError", "line 1"]),
    ("VALUE = 1 / 0\n", ["helpers.py, which probe.py imports, does not import", "ZeroDivisionError", "line 1"]),
])
def test_a_broken_helper_is_named_not_the_file_that_imports_it(tmp_path, cpu, helper, words):
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "helpers.py").write_text(helper)
    _, checks = run(tmp_path, cpu, "import helpers\n\n" + GOOD)
    assert checks["answers"].status == "error"
    assert all(w in checks["answers"].message for w in words), checks["answers"].message


def test_wrong_answer_fails_and_withholds_performance_credit(tmp_path, cpu):
    result, checks = run(tmp_path, cpu, GOOD.replace("42", "41"))
    assert checks["answers"].status == "failed"
    assert "returned 41" in checks["answers"].message
    assert checks["fast"].status == "failed"
    assert "no credit yet" in checks["fast"].message


def test_missing_file_is_an_error_naming_it(tmp_path, cpu):
    folder = tmp_path / "empty"
    folder.mkdir()
    result = grade(Course(FIXTURE), "week01", folder, hardware=cpu)
    statuses = {c.id: c.status for c in result.checks}
    assert statuses == {"answers": "error", "survives": "error", "on-gpu": "blocked", "fast": "failed"}
    assert "probe.py is missing" in result.checks[0].message


def test_starter_not_implemented_is_failed_not_passed(tmp_path, cpu):
    result, checks = run(tmp_path, cpu, (FIXTURE / "labs/week01-probe/starter/probe.py").read_text())
    assert checks["answers"].status == "failed" and "not written yet" in checks["answers"].message


# ---------------------------------------------------------------------------------------------- what the runner decides
# Unit tests of the runner's own rules: they hold whatever a judge sends, so they take events as lines.

from infracourse.grading import runner  # noqa: E402
from infracourse.grading.results import CheckResult, GradeResult  # noqa: E402
from judgechannel import Channel  # noqa: E402


@pytest.fixture(scope="module")
def lab():
    return Course(FIXTURE).lab("week01")


def test_a_result_counts_only_after_its_own_start_and_only_once(lab):
    channel = Channel(lab)
    channel.send(event="result", check="answers", status="passed")
    assert "answers" not in channel.newly  # no start yet
    channel.send(event="start", check="answers")
    channel.send(event="result", check="answers", status="failed", message="returned 41")
    channel.send(event="result", check="answers", status="passed")
    channel.send(event="start", check="answers")
    channel.send(event="result", check="answers", status="passed")
    assert channel.newly["answers"].status == "failed" and channel.newly["answers"].message == "returned 41"


def test_a_result_for_another_check_than_the_running_one_is_ignored(lab):
    channel = Channel(lab)
    channel.send(event="start", check="answers")
    channel.send(event="result", check="survives", status="passed")
    assert channel.newly == {} and channel.running[0] == "answers"


@pytest.mark.parametrize("event", [
    {"event": "start", "check": "not-in-lab-yaml"},
    {"event": "result", "check": "not-in-lab-yaml", "status": "passed"},
    {"event": "verdict", "check": "answers", "status": "passed"},
    {"event": "result", "check": "answers", "status": "excellent"},
    {"event": "result", "check": "answers", "status": "passed", "figures": ["not", "a", "mapping"]},
    {},
])
def test_events_outside_the_contract_are_ignored(lab, event):
    channel = Channel(lab)
    channel.send(event="start", check="answers")
    channel.send(**event)
    assert channel.newly == {} and channel.seen == [{"event": "start", "check": "answers"}]


def test_a_judge_result_for_a_check_the_runner_blocked_is_ignored(lab):
    blocked = runner._result(lab.spec.check("on-gpu"), "blocked", "needs a CUDA GPU")
    channel = Channel(lab, settled={"on-gpu": blocked})
    channel.send(event="start", check="on-gpu")
    channel.send(event="result", check="on-gpu", status="passed")
    assert channel.newly == {} and channel.running is None and channel.seen == []


def _settled(lab, **statuses):
    return {c.id: runner._result(c, statuses.get(c.id, "passed"), "judge said so") for c in lab.spec.checks}


@pytest.mark.parametrize("answers, fast, expected", [
    ("passed", "passed", "passed"),
    ("failed", "passed", "failed"),
    ("error", "passed", "failed"),
    ("blocked", "passed", "failed"),
    ("failed", "error", "error"),   # the performance check's own crash is still reported as such
])
def test_requires_credit_is_withheld_by_the_runner(lab, answers, fast, expected):
    settled = _settled(lab, answers=answers, fast=fast)
    runner._withhold_unearned_credit(lab.spec.checks, settled)
    assert settled["fast"].status == expected
    if expected == "failed":
        assert settled["fast"].message.startswith("no credit yet: answers must pass")
    assert settled["answers"].status == answers


def _grade(*checks):
    return GradeResult(week="week01", tier="cpu", device="cpu", fingerprint="", started_at="", seconds=0,
                       checks=[CheckResult(id=i, title=i, kind=kind, needs=needs, status=status)
                               for i, kind, needs, status in checks])


def test_complete_needs_a_correctness_check_passed_here():
    assert _grade(("a", "correctness", "cpu", "passed"), ("g", "correctness", "cuda", "blocked")).complete
    # every correctness check blocked (the CUDA C++ route on a CPU machine): its answers were never checked
    only_blocked = _grade(("a", "correctness", "cuda", "blocked"), ("p", "performance", "cpu", "passed"),
                          ("r", "report", "cpu", "passed"))
    assert not only_blocked.complete and not only_blocked.verified_on_gpu
    assert not _grade(("a", "correctness", "cpu", "passed"), ("e", "performance", "cpu", "error")).complete
    assert not _grade().complete


def test_blocked_is_decided_by_the_runner_from_its_hardware(tmp_path, cpu):
    """The fixture's on-gpu grader fails if it ever runs: on CPU the runner settles it before any judge starts,
    so the judge never even starts it."""
    folder = tmp_path / "learner"
    folder.mkdir()
    (folder / "probe.py").write_text(GOOD)
    events = []
    grade(Course(FIXTURE), "week01", folder, hardware=cpu, on_event=events.append)
    assert {"event": "result", "check": "on-gpu", "status": "blocked"} == events[0]
    assert not any(e.get("check") == "on-gpu" and e["event"] == "start" for e in events)
    calls = [e for e in events if e["event"] == "calling"]  # each learner call a running check made, as it came
    assert calls and all(e["check"] in {s["check"] for s in events if s["event"] == "start"} for e in calls)
    assert all(isinstance(e["target"], str) and e["target"] for e in calls)


PARSE_CHECKS = ("  - {id: answers, title: \"answers\", threshold: 2.0}\n"
                "  - {id: crash, title: \"kills its judge process\"}\n"
                "  - {id: again, title: \"runs in the next judge process\", threshold: 3.0}\n")
PARSE_GRADERS = '''import os

import pytest


@pytest.mark.check("answers")
def test_answers(learner, lab_check, record):
    assert learner.module("probe").answer() == 42
    record("threshold", lab_check.threshold)


@pytest.mark.check("crash")
def test_crash():
    os._exit(3)


@pytest.mark.check("again")
def test_again(lab_check, record):
    record("threshold", lab_check.threshold)
'''


def test_lab_yaml_is_parsed_once_per_grade(tmp_path, cpu, monkeypatch):
    """The runner parses lab.yaml once (none when handed a LabDir); every judge process of the grade (a fresh
    one after a crash too) takes the spec it was given: lab.yaml rewritten on disk after the parse is not seen."""
    from minicourse import make_course

    from infracourse import syllabus

    course = make_course(tmp_path / "course", PARSE_CHECKS, PARSE_GRADERS, "answers")
    parses = []
    read_yaml = syllabus._read_yaml
    monkeypatch.setattr(syllabus, "_read_yaml", lambda path: (path.name == "lab.yaml" and parses.append(path.name))
                        or read_yaml(path))
    lab = course.lab("week01")
    assert parses == ["lab.yaml"]
    lab_yaml = lab.path / "lab.yaml"
    lab_yaml.write_text(lab_yaml.read_text().replace("threshold: 2.0", "threshold: 9.0")
                        .replace("threshold: 3.0", "threshold: 9.0"))
    folder = tmp_path / "learner"
    folder.mkdir()
    (folder / "probe.py").write_text(GOOD)
    checks = {c.id: c for c in grade(course, lab, folder, hardware=cpu).checks}
    assert parses == ["lab.yaml"]  # none in the runner
    assert checks["answers"].status == "passed" and checks["answers"].figures["threshold"].value == 2.0
    assert checks["crash"].status == "error" and "died during this check" in checks["crash"].message
    assert checks["again"].status == "passed" and checks["again"].figures["threshold"].value == 3.0
    checks = {c.id: c for c in grade(course, "week01", folder, hardware=cpu).checks}
    assert parses == ["lab.yaml", "lab.yaml"]  # a week reference: one parse, by the runner
    assert checks["answers"].figures["threshold"].value == 9.0  # ... and that spec is what the judges got
    assert checks["again"].figures["threshold"].value == 9.0


def test_two_grader_tests_deciding_one_check_are_refused(tmp_path, cpu):
    """The runner keeps a check's first verdict, so a second test of the same check could never fail it: such a
    grader is a course bug, and every check of the grade says so instead of passing."""
    from minicourse import make_course

    graders = ('import pytest\n\n\n@pytest.mark.check("answers")\ndef test_first(learner):\n'
               '    assert learner.module("probe").answer() == 42\n\n\n'
               '@pytest.mark.check("answers")\ndef test_second(learner):\n    assert False, "never reached"\n')
    course = make_course(tmp_path / "course", '  - id: answers\n    title: "answers 42"\n', graders, "answers")
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "probe.py").write_text(GOOD)
    result = grade(course, "week01", learner, hardware=cpu)
    check = {c.id: c for c in result.checks}["answers"]
    assert check.status == "error" and "one test per check" in check.message, (check.status, check.message)
    assert not result.complete
