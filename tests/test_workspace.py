"""Workspace: found like git, unlock never overwrites learner changes, reset keeps a backup, progress is atomic."""
import os
import signal
import subprocess
import sys
import time

import pytest

from infracourse.course import Course
from infracourse.grading.results import CheckResult, GradeResult
from infracourse.progress import Progress, ProgressError
from infracourse.workspace import Workspace, WorkspaceError

from conftest import REPO

FIXTURE = Course(REPO / "tests" / "fixtures" / "course")


def test_find_walks_up_and_honours_env(tmp_path, monkeypatch):
    ws = Workspace.init(tmp_path / "infra")
    deep = ws.root / "week01" / "sub"
    deep.mkdir(parents=True)
    monkeypatch.delenv("INFRACOURSE_WORKSPACE", raising=False)
    assert Workspace.find(start=deep).root == ws.root
    with pytest.raises(WorkspaceError, match="infracourse init"):
        Workspace.find(start=tmp_path)
    monkeypatch.setenv("INFRACOURSE_WORKSPACE", str(ws.root))
    assert Workspace.find(start=tmp_path).root == ws.root


def test_unlock_copies_starter_and_keeps_changed_files(tmp_path):
    ws = Workspace.init(tmp_path)
    week = FIXTURE.week(1)
    report = ws.unlock(FIXTURE, week)
    assert sorted(report.copied) == ["README.md", "probe.py"]
    mine = ws.week_dir(week) / "probe.py"
    mine.write_text("# my work\n")
    again = ws.unlock(FIXTURE, week)
    assert again.kept == ["probe.py"] and not again.newly_unlocked
    assert mine.read_text() == "# my work\n"


def test_next_stops_at_planned_until_unlocked(tmp_path):
    ws = Workspace.init(tmp_path)
    assert ws.next_week(FIXTURE).id == "week01"
    ws.unlock(FIXTURE, FIXTURE.week(1))
    planned = ws.next_week(FIXTURE)
    assert planned.id == "week02" and planned.planned
    assert ws.unlock(FIXTURE, planned).folder is None
    assert ws.next_week(FIXTURE) is None


def test_reset_restores_starter_with_backup(tmp_path):
    ws = Workspace.init(tmp_path)
    week = FIXTURE.week(1)
    ws.unlock(FIXTURE, week)
    mine = ws.week_dir(week) / "probe.py"
    mine.write_text("# my work\n")
    backup = ws.reset(FIXTURE, week)
    assert (backup / "probe.py").read_text() == "# my work\n"
    assert "NotImplementedError" in mine.read_text()


def _result(week="week01", status="passed"):
    return GradeResult(week=week, tier="cpu", device="cpu", fingerprint="f", started_at="2026-01-01T00:00:00",
                       seconds=1.0, checks=[CheckResult(id="a", title="a", kind="correctness", needs="cpu",
                                                        status=status, figures={"x": {"value": 2.0, "unit": "s"}})])


def test_progress_records_and_summarises(tmp_path):
    store = Progress(tmp_path / "p.db")
    store.record(_result(status="failed"))
    store.record(_result())
    assert store.weeks_summary() == {"week01": {"attempts": 2, "passed": True, "verified_on_gpu": False}}
    assert store.last_grade("week01").checks[0].figures["x"].value == 2.0
    assert store.next_hint_index("week01", 2) == 1
    assert store.next_hint_index("week01", 2) == 2
    assert store.next_hint_index("week01", 2) == 2


def test_corrupt_database_is_named_with_the_fix(tmp_path):
    path = tmp_path / "p.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ProgressError, match="p.db is not a readable progress database"):
        Progress(path)


def test_kill_during_recording_keeps_earlier_grades(tmp_path):
    """A writer killed mid-stream leaves only whole grades: every grade has all its checks."""
    db = tmp_path / "p.db"
    Progress(db).record(_result())
    script = f"""
import sys
from infracourse.progress import Progress
from infracourse.grading.results import CheckResult, GradeResult
store = Progress(__import__('pathlib').Path({str(db)!r}))
checks = [CheckResult(id=f"c{{i}}", title="t", kind="correctness", needs="cpu", status="passed") for i in range(200)]
print("ready", flush=True)
while True:
    store.record(GradeResult(week="week01", tier="cpu", device="cpu", fingerprint="f", started_at="now",
                             seconds=1.0, checks=checks))
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    import sqlite3

    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    per_grade = con.execute("SELECT g.id, COUNT(c.check_id) FROM grades g LEFT JOIN checks c ON c.grade_id = g.id "
                            "GROUP BY g.id").fetchall()
    assert per_grade[0] == (1, 1)
    assert len(per_grade) > 2 and all(n == 200 for _, n in per_grade[1:])
