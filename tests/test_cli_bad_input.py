"""Every command over bad input: one clear line on stderr, a non-zero exit, never a traceback."""
import contextlib
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from infracourse import cli
from infracourse.cli import app
from infracourse.grading.results import CheckResult, GradeResult
from infracourse.workspace import Workspace

runner = CliRunner()
WEEK_COMMANDS = ("grade", "hint", "reset", "watch", "report", "unlock", "submit")


@contextlib.contextmanager
def read_only(path):
    """Make a folder really read-only: chmod for a user; a read-only bind mount for root (chmod binds no root)."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")]}
        for p in modes:
            p.chmod(modes[p] & ~0o222)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    mount = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    if mount.returncode or subprocess.run(["mount", "-o", "remount,bind,ro", str(path)]).returncode:
        if not mount.returncode:
            subprocess.run(["umount", str(path)])
        pytest.skip("cannot make a read-only folder here (root without mount rights)")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.delenv("INFRACOURSE_WORKSPACE", raising=False)
    workspace = Workspace.init(tmp_path / "infra")
    from infracourse.course import Course

    workspace.unlock(Course(), Course().week("week07"))
    monkeypatch.chdir(workspace.root)
    return workspace.root


def run(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def one_line_error(result, *expected, code=2):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == code, (result.exit_code, result.output)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def test_init_on_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    one_line_error(run("init", tmp_path / "f"), "is a file")


def test_init_in_a_read_only_folder(tmp_path):
    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro"):
        one_line_error(run("init", tmp_path / "ro" / "ws"), "permission problem", str(tmp_path / "ro"))


@pytest.mark.parametrize("command", ["status", "next", "grade week07", "hint 7", "reset 7", "watch 7", "report 7",
                                     "unlock 7", "submit 7"])
def test_no_workspace_says_how_to_make_one(tmp_path, monkeypatch, command):
    monkeypatch.delenv("INFRACOURSE_WORKSPACE", raising=False)
    monkeypatch.chdir(tmp_path)
    one_line_error(run(*command.split()), "infracourse init")


@pytest.mark.parametrize("command", WEEK_COMMANDS)
def test_unknown_week(ws, command):
    one_line_error(run(command, "week99"), "week99")


@pytest.mark.parametrize("command", ["grade", "hint", "reset", "watch", "report"])
def test_no_week_outside_a_week_folder(ws, command):
    one_line_error(run(command), "which week?")


def test_week_inferred_inside_its_folder(ws, monkeypatch):
    monkeypatch.chdir(ws / "week07")
    out = run("hint")
    assert out.exit_code == 0 and "Hint 1/" in out.output


@pytest.mark.parametrize("command", ["report 7", "reset 7"])
def test_read_only_week_folder_is_a_permission_problem(ws, command):
    (ws / "week07" / "vector_ops.py").write_text("# mine\n")
    with read_only(ws / "week07"):
        one_line_error(run(*command.split()), "permission problem", "week07")


@pytest.mark.parametrize("command", ["status", "hint 7", "next"])
def test_read_only_workspace_is_not_called_corrupt(ws, command):
    with read_only(ws):
        line = one_line_error(run(*command.split()), "permission problem")
    assert "corrupt" not in line and "not a readable" not in line and "move it aside" not in line


@pytest.mark.parametrize("command", ["status", "hint 7", "next", "syllabus", "doctor"])
def test_missing_course_content_names_the_file(ws, tmp_path, monkeypatch, command):
    monkeypatch.setenv("INFRACOURSE_COURSE", str(tmp_path / "no-course"))
    one_line_error(run(*command.split()), "syllabus.yaml", "file not found")


def test_doctor_calibrate_without_a_gpu(monkeypatch):
    from infracourse import hardware

    hw = hardware.detect()
    monkeypatch.setattr(hardware, "detect", lambda: hw)
    if hw.gpu_count:
        pytest.skip("this machine has a GPU: calibration is possible here")
    one_line_error(run("doctor", "--calibrate"), "needs a CUDA GPU")


@pytest.mark.parametrize("command", ["doctor", "doctor --json"])
def test_doctor_failure_is_one_line(monkeypatch, command):
    from infracourse import hardware

    def broken():
        raise RuntimeError("nvidia-smi\nexploded")

    monkeypatch.setattr(hardware, "detect", broken)
    one_line_error(run(*command.split()), "RuntimeError", "nvidia-smi exploded", "INFRACOURSE_DEBUG=1", code=3)


def test_submit_with_a_bad_learner_id(ws):
    Workspace(ws).progress.record(GradeResult(
        week="week07", tier="cpu", device="cpu", fingerprint="f", started_at="t", seconds=1.0,
        checks=[CheckResult(id="c", title="t", kind="correctness", needs="cpu", status="failed")]))
    one_line_error(run("submit", "7", "--learner", "bad id"))


def test_global_workspace_before_or_after_the_command(ws, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["--workspace", ws, "hint", "7"], ["hint", "7", "--workspace", ws], ["-w", ws, "hint", "7"]):
        out = run(*args)
        assert out.exit_code == 0 and "Hint" in out.output, out.output


def test_version_and_short_help():
    from infracourse import __version__

    assert run("--version").output.strip() == f"infracourse {__version__}"
    short = run("-h")
    assert short.exit_code == 0 and "status" in short.output and "cohort" in short.output
    assert run("grade", "-h").exit_code == 0


def test_ctrl_c_says_interrupted(ws, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.views, "status_rows", interrupted)
    out = run("status")
    assert out.exit_code == 130 and out.stderr.strip() == "interrupted" and "Traceback" not in out.output


def test_an_unexpected_failure_is_one_line_not_a_traceback(ws, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cli.views, "status_rows", broken)
    one_line_error(run("status"), "ZeroDivisionError", "boom", "INFRACOURSE_DEBUG=1", code=3)


def test_the_console_script_ctrl_c_and_help_need_no_course_import():
    """`--help` starts without pydantic, torch or the cohort tools (what keeps it fast)."""
    code = ("import sys; from infracourse.cli import app\n"
            "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'pydantic', 'infracourse.cohort.cli', 'jinja2') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_status_does_not_import_torch(ws):
    code = ("import sys; from infracourse.cli import app\n"
            "try:\n    app(['status'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ws)
    assert "TORCH False" in out.stdout and "built weeks passed" in out.stdout and "next:" in out.stdout, out.stdout
