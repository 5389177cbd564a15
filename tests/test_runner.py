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
