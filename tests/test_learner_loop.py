"""The learner's loop itself: watch regrades every save (and only saves), every view shows learner text
literally, a lost progress database comes back, and a segfault in learner code says where it happened."""
import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from infracourse import views
from infracourse.course import Course
from infracourse.grading.results import CheckResult, GradeResult
from infracourse.hardware import Hardware
from infracourse.progress import Progress, ProgressError
from infracourse.watch import folder_stamp, watch_loop
from infracourse.workspace import UnlockReport, Workspace

from conftest import REPO

MARKUP = "[/i] [bold]x[/bold] [link=x]y[/link] ordered[low] logits[i, :len_i] [red]"


# ------------------------------------------------------------------ watch
class FakeFolder:
    """The watched folder as a scripted stamp: each look returns the next state."""

    def __init__(self, tmp_path):
        self.folder = tmp_path
        self.saves = 0

    def save(self, name="kernel.py"):
        self.saves += 1
        (self.folder / name).write_text(f"# save {self.saves}\n")
        stat = (self.folder / name).stat()
        os.utime(self.folder / name, ns=(stat.st_atime_ns, stat.st_mtime_ns + self.saves * 10**9))


def _result(status="failed", message="m", week="week07"):
    return GradeResult(week=week, tier="cpu", device="cpu", fingerprint="f", started_at="t", seconds=1.0,
                       checks=[CheckResult(id="c1", title="t", kind="correctness", needs="cpu", status=status,
                                           message=message),
                               CheckResult(id="c2", title="t", kind="performance", needs="cuda", status="blocked",
                                           message="needs a GPU")])


def test_a_save_during_a_grade_is_graded_after_it(tmp_path):
    folder = FakeFolder(tmp_path)
    folder.save()
    shown, looks = [], []

    def grade():
        if len(shown) == 0:
            folder.save()  # the learner saves while the first grade runs
        return _result(message=f"grade {len(shown) + 1}")

    def sleep(_):
        looks.append(1)

    graded = watch_loop(tmp_path, grade, shown.append, sleep=sleep, stop=lambda: len(looks) >= 3)
    assert graded == 2 and [r.checks[0].message for r in shown] == ["grade 1", "grade 2"]


def test_generated_files_do_not_trigger_a_regrade(tmp_path):
    (tmp_path / "kernel.py").write_text("x = 1\n")
    before = folder_stamp(tmp_path)
    for name in (".grade/result.json", ".grade/week07-roofline.png", "__pycache__/kernel.cpython-311.pyc",
                 ".backup-20260101-000000/kernel.py", "kernel.py.swp", "kernel.py~", ".#kernel.py", "4913",
                 ".pytest_cache/v/x"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("generated")
    assert folder_stamp(tmp_path) == before
    (tmp_path / "notes.md").write_text("mine")
    assert folder_stamp(tmp_path) != before


def test_watch_without_saves_grades_once(tmp_path):
    (tmp_path / "kernel.py").write_text("x = 1\n")
    looks = []
    graded = watch_loop(tmp_path, _result, lambda r: None, sleep=looks.append, stop=lambda: len(looks) >= 5)
    assert graded == 1 and looks == [0.5] * 5


def test_watch_screen_shows_summary_failures_and_next_step():
    out = _render(lambda c: views.print_watch(c, _result(message="off by one in the tail"), None))
    assert out.splitlines()[0].startswith("week07 not complete: 1 failed, 1 blocked")
    assert "✗ c1 (failed): off by one in the tail" in out and "blocked here" in out and "c2" in out
    passed = GradeResult(week="week07", tier="cpu", device="cpu", fingerprint="f", started_at="t", seconds=1.0,
                         checks=[CheckResult(id="c1", title="t", kind="correctness", needs="cpu", status="passed",
                                             message="fine")])
    done = _render(lambda c: views.print_watch(c, passed, "infracourse next   (unlocks week08)"))
    assert "week07 complete" in done and "next: infracourse next" in done and "c1" not in done


def test_watch_command_clears_and_regrades(tmp_path, monkeypatch):
    """The real command, with the grade and the loop's waits replaced: clear screen, summary, next step."""
    from typer.testing import CliRunner

    from infracourse import cli, watch

    ws = Workspace.init(tmp_path / "ws")
    ws.unlock(Course(REPO), Course(REPO).week("week07"))
    cleared = []
    monkeypatch.setattr(cli.console, "clear", lambda *a: cleared.append(1))
    monkeypatch.setattr(cli, "_grade", lambda ws, course, w, **options: _result(status="passed"))
    real_loop = watch.watch_loop
    monkeypatch.setattr(watch, "watch_loop", lambda folder, grade, show, interval: real_loop(
        folder, grade, show, sleep=lambda s: None, stop=lambda: bool(cleared)))
    monkeypatch.chdir(ws.root / "week07")  # the week is inferred from the folder
    out = CliRunner().invoke(cli.app, ["watch"], env={"INFRACOURSE_WORKSPACE": ""}, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert cleared and "week07 complete" in out.output and "next: infracourse" in out.output
    assert (ws.root / "week07" / ".grade" / "result.json").is_file()  # what a rebuild reads


# ------------------------------------------------------------------ escaping
def _render(draw) -> str:
    buffer = io.StringIO()
    draw(Console(file=buffer, width=400, color_system=None, legacy_windows=False))
    return buffer.getvalue()


def _squash(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_every_view_shows_markup_looking_text_literally(tmp_path):
    course = Course(REPO)
    week = course.week("week07").model_copy(update={"title": MARKUP})
    result = GradeResult(week="week07", tier="cpu", device=MARKUP, fingerprint="f", started_at="t", seconds=1.0,
                         checks=[CheckResult(id=f"id{MARKUP}", title="t", kind="correctness", needs="cpu",
                                             status="failed", message=MARKUP,
                                             figures={"x": {"value": 1.0, "unit": MARKUP}})])
    hw = Hardware(tier="cpu", gpu_count=0, gpu_name=None, gpu_memory_gib=None, sm_count=None, l2_bytes=None,
                  cuda=None, driver=None, python="3", torch=MARKUP, triton=None, cpu=MARKUP, cpu_count=2)
    row = {"week": "week07", "title": MARKUP, "lab": "ready", "state": "unlocked", "attempts": 1,
           "last_grade": {"at": MARKUP, "tier": "cpu", "passed": 0, "checks": 1, "blocked": 0, "complete": False}}
    drawings = {
        "unlock": lambda c: views.print_unlock(c, course, UnlockReport(week=week, folder=tmp_path / MARKUP,
                                                                         copied=[MARKUP], kept=[MARKUP])),
        "status": lambda c: views.print_status(c, [row], f"infracourse watch {MARKUP}"),
        "grade": lambda c: views.print_grade(c, result, [tmp_path / MARKUP]),
        "watch": lambda c: views.print_watch(c, result, None),
        "hints": lambda c: views.print_hints(c, [MARKUP, MARKUP], 2),
        "doctor": lambda c: views.print_doctor(c, hw, None, {"week07": [MARKUP]}),
        "syllabus": lambda c: views.print_syllabus(c, [week], detail=True),
        "syllabus table": lambda c: views.print_syllabus(c, [week], detail=False),
    }
    for name, draw in drawings.items():
        out = _squash(_render(draw))
        assert _squash(MARKUP) in out, f"{name} mangled the text:\n{out}"


def test_garbled_hints_render_as_written():
    """week 1 hint 3 and week 3 hint 2 index with [low], [high] and [i, :len_i]."""
    course = Course(REPO)
    for week, index in (("week01", 2), ("week03", 1)):
        text = course.lab(week).spec.hints[index]
        assert "[" in text
        assert _squash(text) in _squash(_render(lambda c: views.print_hints(c, [text], 5)))


# ------------------------------------------------------------------ progress database
def test_progress_backup_restores_a_deleted_database(tmp_path):
    ws = Workspace.init(tmp_path / "ws")
    ws.progress.unlock("week01")
    ws.progress.record(_result(week="week01"))
    db = ws.meta / "progress.db"
    for path in ws.meta.glob("progress.db*"):
        if not path.name.endswith(".bak"):
            path.unlink()
    again = Workspace(ws.root)
    assert "restored from its backup" in again.progress.notice
    assert "week01" in again.progress.unlocked() and again.progress.last_grade("week01") is not None
    assert db.is_file()


def test_corrupt_database_is_replaced_by_its_backup_and_kept_aside(tmp_path):
    store = Progress(tmp_path / "p.db")
    store.unlock("week02")
    (tmp_path / "p.db").write_bytes(b"garbage " * 1000)
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp_path / 'p.db'}{suffix}").unlink(missing_ok=True)
    again = Progress(tmp_path / "p.db")
    assert "restored from its backup" in again.notice and "week02" in again.unlocked()
    assert list(tmp_path.glob("p.db.unreadable-*"))


def test_lost_database_without_backup_is_rebuilt_from_the_week_folders(tmp_path):
    ws = Workspace.init(tmp_path / "ws")
    ws.progress.unlock("week01")
    (ws.root / "week01").mkdir()
    (ws.root / "week02").mkdir()
    ws.save_result(_result(week="week01", status="passed"))
    for path in ws.meta.glob("progress.db*"):
        path.unlink()
    again = Workspace(ws.root)
    notice = again.progress.notice
    assert "had no backup" in notice and "rebuilt 2 unlock(s)" in notice and "1 last grade(s)" in notice
    assert "lost" in notice
    assert set(again.progress.unlocked()) == {"week01", "week02"}
    assert again.progress.last_grade("week01").checks[0].status == "passed"


def test_corrupt_database_without_backup_says_what_is_lost_and_how_to_rebuild(tmp_path):
    path = tmp_path / "p.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ProgressError) as raised:
        Progress(path)
    message = str(raised.value)
    assert "no backup" in message and "rebuilt from the week folders" in message and "lost" in message
    assert path.read_bytes().startswith(b"this is not sqlite")  # the learner's file is not destroyed


# ------------------------------------------------------------------ segfault location
def test_a_segfault_in_learner_code_shows_where(tmp_path):
    from infracourse.grading.remote import WorkerClient, WorkerFailed

    (tmp_path / "crash.py").write_text("import ctypes\n\ndef boom():\n    return ctypes.string_at(0)\n")
    worker = WorkerClient(tmp_path, gpu=False)
    try:
        with pytest.raises(WorkerFailed) as raised:
            worker.module("crash").boom()
    finally:
        worker.close()
    message = str(raised.value)
    assert "segmentation fault" in message.lower() and "crash.py" in message and "line 4" in message


def test_status_says_a_passed_week_is_not_complete_now_when_its_last_grade_is_not():
    last = {"at": "2026-12-05T20:00:00", "tier": "cpu", "passed": 3, "checks": 10, "blocked": 0, "complete": False}
    row = {"week": "week07", "title": "Triton basics", "lab": "ready", "state": "passed", "attempts": 2,
           "last_grade": last}
    shown = _squash(_render(lambda c: views.print_status(c, [row], "infracourse watch week07")))
    assert "3/10 passed on cpu" in shown and "not complete now (the week passed in an earlier grade)" in shown
    whole = _squash(_render(lambda c: views.print_status(c, [row | {"last_grade": last | {"complete": True,
                                                                                           "passed": 10}}], "x")))
    assert "not complete now" not in whole


def test_the_grade_table_names_each_figure_and_explains_its_columns():
    check = CheckResult(id="reduce-accuracy", title="t", kind="correctness", needs="cpu", status="passed",
                        figures={"relative error": {"value": 3.7e-8, "target": 1e-5, "unit": ""},
                                 "other": {"value": 1.0}})
    result = GradeResult(week="week07", tier="cpu", device="cpu", fingerprint="f", started_at="t", seconds=1.0,
                         checks=[check])
    shown = _squash(_render(lambda c: views.print_grade(c, result)))
    assert "relative error: 3.7e-08" in shown and "1e-05" in shown
    assert "measured: the figure the check judged" in shown and "target: the bar it had to meet" in shown
    assert "marked 're-measured', what the grader itself measured" in shown


def test_the_grade_table_shows_the_judged_figure_and_marks_a_re_measured_target():
    """Week 15's decode speed-up row showed the prefill time (recorded first, with no target); a target that is
    the grader's own measurement read as a bar."""
    speedup = CheckResult(id="decode-speedup", title="t", kind="performance", needs="cpu", status="passed",
                          figures={"prefill": {"value": 4.2, "unit": "ms"},
                                   "decode speed-up": {"value": 3.1, "target": 2.0, "unit": "x"}})
    alpha = CheckResult(id="cost-model", title="t", kind="performance", needs="cpu", status="passed",
                        figures={"alpha": {"value": 539.0, "target": 612.0, "unit": "us", "target_is": "re-measured"}})
    result = GradeResult(week="week15", tier="cpu", device="cpu", fingerprint="f", started_at="t", seconds=1.0,
                         checks=[speedup, alpha])
    shown = _squash(_render(lambda c: views.print_grade(c, result)))
    assert "decode speed-up: 3.1 x" in shown and "prefill" not in shown
    assert "alpha: 539 us re-measured 612 us" in shown
