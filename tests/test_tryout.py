"""`infracourse run`: the learner's own command runs as a grade runs their code (the interpreter on a CPU, the
sandbox), in the week folder, which stays writable; its exit code is the command's."""
import shutil

import pytest
from typer.testing import CliRunner

from infracourse import sandbox
from infracourse.cli import app
from infracourse.course import Course
from infracourse.grading.tryout import run_like_a_grade
from infracourse.workspace import Workspace

from conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "course"
# what the learner's command sees, written where the learner can read it afterwards
REPORT = ("import os, probe; open('seen.txt', 'w').write(' '.join([str(probe.answer()), "
          "os.environ.get('TRITON_INTERPRET', '-'), str(os.path.exists({labs!r}))]))")


@pytest.fixture
def week(tmp_path):
    ws = Workspace.init(tmp_path / "ws")
    course = Course(FIXTURE)
    ws.unlock(course, course.week("week01"))
    shutil.copy(FIXTURE / "labs" / "week01-probe" / "solution" / "probe.py", ws.root / "week01" / "probe.py")
    return ws.root / "week01", course.lab("week01")


def test_the_command_runs_in_the_week_folder_as_a_grade_would(week, machine):
    folder, lab = week
    code = run_like_a_grade(lab, folder, ["python", "-c", REPORT.format(labs=str(REPO / "labs"))], machine)
    assert code == 0
    answer, interpret, sees_course = (folder / "seen.txt").read_text().split()
    assert answer == "42"  # started in the week folder: the learner's module imports as in their own shell
    assert interpret == ("-" if machine.gpu_count else "1")
    if sandbox.status().available:
        assert sees_course == "False"  # confined as a grade is: the course's solutions are out of sight


def test_the_exit_code_is_the_commands(week, machine):
    folder, lab = week
    assert run_like_a_grade(lab, folder, ["python", "-c", "raise SystemExit(3)"], machine) == 3


def test_the_cli_takes_the_command_after_a_double_dash(week, monkeypatch):
    folder, _ = week
    monkeypatch.chdir(folder)  # the week comes from the folder: `infracourse run -- python ...`
    env = {"INFRACOURSE_WORKSPACE": str(folder.parent), "INFRACOURSE_COURSE": str(FIXTURE)}
    out = CliRunner().invoke(app, ["run", "--", "python", "-c", "open('cli.txt', 'w').write('ran')"], env=env,
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert (folder / "cli.txt").read_text() == "ran"
