"""Hostile learner files (issue 9): each tries every attack we know at import time inside the grading worker —
forge the events channel, patch the judge's plugin / pytest / comparison / reference functions / clock, steal
the shipped solutions, write the progress database, the graders and the Python environment, read and write
outside the sandbox, reach the network, leave a double-forked daemon — then hands the graders wrong answers
dressed to compare equal to anything. None of it may pass a check, complete a week, change a file outside the
sandbox or leave a process running.

The payload (tests/fixtures/hostile/attacks.py) records which attempts got through; one function of each lab
raises that record, so it comes back as that check's `error` message, and these tests read it. The outcome is
also checked from outside: statuses, hashes of every file the attacker knew about, the processes alive
afterwards, and listeners on the host that must not have been reached.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import time
import uuid
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from infracourse import sandbox
from infracourse.cli import app
from infracourse.course import Course
from infracourse.grading.results import GradeResult
from infracourse.grading.runner import grade
from infracourse.workspace import Workspace

from conftest import REPO

HOSTILE = REPO / "tests" / "fixtures" / "hostile"
FIXTURE = REPO / "tests" / "fixtures" / "course"
ATTACKS = 9  # the _attempt calls in attacks.py (the daemon's fate is judged from outside)

pytestmark = pytest.mark.skipif(not sandbox.status().available, reason="the attack suite needs the sandbox "
                                f"(here: {sandbox.status().describe()}); unsandboxed, learner code is trusted")


class Attacker:
    """What the hostile learner is assumed to know (every path and port), and the outside view of the damage."""

    def __init__(self, tmp_path: Path, course_root: Path, lab_file: str, checks: list[str]):
        self.token = f"infracourse-hostile-{uuid.uuid4().hex}"
        self.tmp = tmp_path
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.tcp.setblocking(False)
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind("\0" + self.token)
        self.unix.listen()
        self.unix.setblocking(False)
        secret = tmp_path / "host-secret.txt"
        secret.write_text("not for learners\n")
        solutions = sorted(str(p) for p in course_root.glob("labs/*/solution/*"))
        self.protected: list[Path] = [p for p in course_root.glob("graders/**/*") if p.is_file()] + \
            [Path(p) for p in solutions] + [secret]
        self.secret: list[str] = solutions + [str(secret)]
        self.outside: list[str] = [str(tmp_path), str(course_root / "graders")]  # (its HOME and /tmp are private)
        self.course_roots, self.lab_file, self.checks = [str(course_root)], lab_file, checks
        self.descendants_before = {p.pid for p in psutil.Process().children(recursive=True)}

    def also_knows(self, course_root: Path) -> None:
        """Another copy of the course (the checkout): its solutions are to be stolen, if readable."""
        self.course_roots.append(str(course_root))
        self.secret += sorted(str(p) for p in course_root.glob("labs/*/solution/*"))

    def guard(self, *paths: Path, secret: bool = False, outside: Path | None = None) -> None:
        """More files the attacker knows of (a progress database, a gradebook, other bundles)."""
        self.protected += list(paths)
        if secret:
            self.secret += [str(p) for p in paths]
        if outside is not None:
            self.outside.append(str(outside))

    def source(self, tail: str) -> str:
        targets = {"token": self.token, "tcp_port": self.tcp.getsockname()[1], "abstract_socket": self.token,
                   "checks": self.checks, "lab_file": self.lab_file, "course_roots": self.course_roots,
                   "protected": [str(p) for p in self.protected], "secret": self.secret, "outside": self.outside}
        payload = (HOSTILE / "attacks.py").read_text().replace("@TARGETS@", json.dumps(targets))
        return payload + (HOSTILE / tail).read_text()

    def hashes(self) -> dict[str, str]:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in self.protected if p.is_file()}

    def survivors(self) -> list[str]:
        """Processes left by the grade: any carrying the daemon's token, and any new child of this test."""
        time.sleep(0.5)  # a daemon killed with its namespace is reaped by then
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if self.token in " ".join(proc.info["cmdline"] or []):
                found.append(f"{proc.info['pid']}: {' '.join(proc.info['cmdline'])}")
                proc.kill()  # never leave it behind, even when the test fails
        for proc in psutil.Process().children(recursive=True):
            if proc.pid not in self.descendants_before and proc.is_running() and proc.status() != "zombie":
                found.append(f"{proc.pid}: {' '.join(proc.cmdline())}")
        return found

    def reached(self) -> list[str]:
        got = []
        for listener in (self.tcp, self.unix):
            try:
                listener.accept()[0].close()
                got.append(str(listener.getsockname()))
            except BlockingIOError:
                pass
        return got

    def close(self) -> None:
        self.tcp.close()
        self.unix.close()


def report_of(result) -> dict:
    """The payload's record, from the message of the check whose function raised it."""
    for check in result.checks:
        found = re.search(r"HOSTILE-REPORT (\{.*?\}) END", check.message, re.S)
        if found:
            return json.loads(found.group(1))
    raise AssertionError("no check message carries the hostile file's report: " +
                         "; ".join(f"{c.id}: {c.status} {c.message[:200]}" for c in result.checks))


def assert_contained(attacker: Attacker, result, before: dict[str, str]) -> dict:
    statuses = {c.id: c.status for c in result.checks}
    assert "passed" not in statuses.values(), statuses
    assert set(statuses.values()) <= {"failed", "error", "blocked"}, statuses
    assert not result.complete and not result.verified_on_gpu
    assert result.sandboxed
    report = report_of(result)
    assert report["tried"] == ATTACKS, report
    assert report["breaches"] == [], f"attacks that got through the sandbox: {report['breaches']}"
    assert attacker.hashes() == before, "a file outside the sandbox changed"
    assert not [f for f in attacker.outside if (Path(f) / "hostile-was-here").exists()]
    assert not list(Path(attacker.tmp).rglob("hostile-was-here"))
    assert attacker.survivors() == []
    assert attacker.reached() == []
    return statuses


@pytest.fixture
def attacker_for(tmp_path):
    made = []

    def _make(course_root: Path, week: str, lab_file: str) -> Attacker:
        checks = [c.id for c in Course(course_root).lab(week).spec.checks]
        made.append(Attacker(tmp_path, course_root, lab_file, checks))
        return made[-1]

    yield _make
    for attacker in made:
        attacker.survivors()
        attacker.close()


def test_fixture_course_through_the_cli_workspace_and_progress_untouched(tmp_path, monkeypatch, attacker_for):
    """`infracourse grade` in a workspace: the attacker knows where its progress database is."""
    monkeypatch.setenv("INFRACOURSE_COURSE", str(FIXTURE))
    ws = tmp_path / "ws"
    cli = CliRunner()
    assert cli.invoke(app, ["init", str(ws)]).exit_code == 0
    assert cli.invoke(app, ["unlock", "week01", "--workspace", str(ws)]).exit_code == 0
    progress = ws / ".infracourse" / "progress.db"
    attacker = attacker_for(FIXTURE, "week01", "probe.py")
    attacker.guard(progress, outside=ws / ".infracourse")
    (ws / "week01" / "probe.py").write_text(attacker.source("probe.py"))
    before = attacker.hashes()
    before.pop(str(progress))  # the grade itself records an attempt there; checked through the store below
    attacker.protected.remove(progress)
    out = cli.invoke(app, ["grade", "week01", "--workspace", str(ws), "--json"])
    assert out.exit_code == 1, out.output  # not complete
    graded = GradeResult.from_dict(json.loads(out.output[out.output.index("{"):]))
    statuses = assert_contained(attacker, graded, before)
    assert statuses == {"answers": "failed", "survives": "error", "on-gpu": "blocked", "fast": "failed"}
    stored = Workspace(ws).progress.last_grade("week01")
    assert [c.status for c in stored.checks] == list(statuses.values()) and not stored.complete


def _course_copy(tmp_path: Path) -> Path:
    """The course as the grade sees it, copied: other work edits the checkout's graders meanwhile, and were the
    sandbox ever broken, the damage lands here. The attacker also knows the checkout (course_roots)."""
    root = tmp_path / "course"
    for part in ("curriculum", "labs", "graders"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _grade_real_lab(tmp_path, machine, attacker_for, week: str, lab_file: str):
    root = _course_copy(tmp_path)
    course = Course(root)
    folder = tmp_path / week
    shutil.copytree(course.lab(week).starter, folder)
    attacker = attacker_for(root, week, lab_file)
    attacker.also_knows(REPO)
    (folder / lab_file).write_text(attacker.source(lab_file))
    before = attacker.hashes()
    result = grade(course, week, folder, hardware=machine)
    return assert_contained(attacker, result, before), result


@pytest.mark.solutions
def test_week07_vector_ops(machine, tmp_path, attacker_for):
    if machine.gpu_count:
        pytest.skip("the CPU half of the attack suite")
    statuses, _ = _grade_real_lab(tmp_path, machine, attacker_for, "week07", "vector_ops.py")
    assert statuses["add-correct"] == "failed" and statuses["reduce-correct"] == "error"


@pytest.mark.solutions
def test_week01_harness(machine, tmp_path, attacker_for):
    statuses, result = _grade_real_lab(tmp_path, machine, attacker_for, "week01", "harness.py")
    assert statuses["percentiles"] == "failed" and statuses["warmup"] == "error", result.checks
