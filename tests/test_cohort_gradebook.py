"""The gradebook: all-or-nothing imports, duplicates refused, regrades stored whole, and a kill -9 during an
import or a regrade leaves it consistent (run in a subprocess, killed with SIGKILL)."""
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing

import pytest

from infracourse.cohort import synthetic
from infracourse.cohort.gradebook import Gradebook, GradebookError
from infracourse.cohort.outcome import compare
from infracourse.cohort.regrade import regrade
from infracourse.grading.results import CheckResult, GradeResult

from cohort_support import dump, members, rezip


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return synthetic.write_course(tmp_path_factory.mktemp("course"), weeks=3, kernel_weeks=(2,))


@pytest.fixture(scope="module")
def bundles(course, tmp_path_factory):
    return synthetic.write_cohort(course, tmp_path_factory.mktemp("bundles"), learners=40, missing=0)


@pytest.fixture
def book(course, tmp_path):
    return Gradebook.create(tmp_path / "gradebook.db", course)


def test_import_records_submissions_results_and_normalised_figures(book, course, bundles):
    report = book.import_bundles(bundles[:30], course)
    assert report.committed and len(report.imported) == 30 and not report.rejected
    snap = book.snapshot()
    assert len(snap["submissions"]) == 30 and {r[2] for r in snap["results"]} == {"self"}
    shares = [f[5] for f in snap["figures"]]
    assert shares and all(0 <= s <= 1.1 for s in shares), "performance is a fraction of the learner's ceiling"


def test_a_bad_bundle_rejects_the_whole_import_unless_keep_going(book, course, bundles, tmp_path):
    book.import_bundles(bundles[:3], course)
    before = dump(book.path)
    bad = rezip(tmp_path / "bad.zip", {**members(bundles[4]), "files/answer.py": b"tampered"})
    report = book.import_bundles([bundles[3], bad, bundles[5], bundles[0]], course)
    assert not report.committed
    assert [e.kind for e in report.rejected] == ["hash", "duplicate"]
    assert dump(book.path) == before, "a failing import leaves the gradebook exactly as it was"
    report = book.import_bundles([bundles[3], bad, bundles[5]], course, keep_going=True)
    assert report.committed and len(report.imported) == 2 and [e.kind for e in report.rejected] == ["hash"]
    assert len(book.snapshot()["submissions"]) == 5


def test_the_same_bundle_twice_is_refused_whatever_its_name(book, course, bundles, tmp_path):
    copy = shutil.copy(bundles[0], tmp_path / "renamed.zip")
    report = book.import_bundles([bundles[0], copy], course)
    assert [e.kind for e in report.rejected] == ["duplicate"]
    assert "earlier in this import" in str(report.rejected[0]) and str(copy) in str(report.rejected[0])
    book.import_bundles([bundles[0]], course)
    report = book.import_bundles([copy], course)
    assert "already imported from" in str(report.rejected[0]) and str(bundles[0]) in str(report.rejected[0])


def test_opening_something_that_is_not_a_gradebook_says_so(tmp_path):
    with pytest.raises(GradebookError, match="no gradebook at .*: run `infracourse cohort init`"):
        Gradebook(tmp_path / "gradebook.db")
    (tmp_path / "notes.db").write_text("not sqlite")
    with pytest.raises(GradebookError, match="notes.db is not a gradebook"):
        Gradebook(tmp_path / "notes.db")


IMPORTER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from infracourse.cohort.gradebook import Gradebook
    from infracourse.course import Course
    course, book, pause, *paths = sys.argv[1:]
    def on_bundle(path, problem):
        print("recorded", path, flush=True)
        if path == pause:
            time.sleep(600)  # the parent kills us here, mid-transaction
    Gradebook(Path(book)).import_bundles(paths, Course(Path(course)), on_bundle=on_bundle)
    print("done", flush=True)
""")


def _start(script, *args, env=None):
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True,
                            env=env)


def _wait_for(proc, text):
    for line in proc.stdout:
        if text in line:
            return line
    raise AssertionError(f"the subprocess ended before printing {text!r}")


def test_kill_9_during_import_leaves_the_gradebook_as_it_was(book, course, bundles):
    book.import_bundles(bundles[:5], course)
    before = dump(book.path)
    batch = bundles[5:]
    proc = _start(IMPORTER, course.root, book.path, batch[20], *batch)
    _wait_for(proc, f"recorded {batch[20]}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert dump(book.path) == before
    for delay in (0.05, 0.3, 0.6, 1.0):  # and at whatever moment a kill happens to land
        proc = _start(IMPORTER, course.root, book.path, "", *batch)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        held = len(Gradebook(book.path).snapshot()["submissions"])
        assert held in (5, len(bundles)), "all of the import or none of it"
        assert held == len(bundles) or dump(book.path) == before
        _assert_whole(book.path)
    report = Gradebook(book.path).import_bundles(batch, course, keep_going=True)
    assert len(Gradebook(book.path).snapshot()["submissions"]) == len(bundles)
    assert len(report.imported) + len(report.rejected) == len(batch)
    assert all(e.kind == "duplicate" for e in report.rejected), "only a completed import can have left anything"


def _assert_whole(path):
    """Every submission has its self-reported result; nothing points at a missing row."""
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert db.execute("SELECT COUNT(*) FROM submissions s WHERE (SELECT COUNT(*) FROM results r WHERE "
                          "r.submission_id = s.id AND r.origin = 'self') != 1").fetchone()[0] == 0


REGRADER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from infracourse.cohort.gradebook import Gradebook
    from infracourse.cohort.regrade import regrade
    from infracourse.course import Course
    course, book = sys.argv[1:]
    def on_submission(sub):
        print("grading", sub.learner, flush=True)
    regrade(Gradebook(Path(book)), Course(Path(course)), week="week01", on_submission=on_submission)
    print("done", flush=True)
""")


@pytest.mark.slow
def test_regrade_verifies_survives_kill_9_and_resumes(book, course, bundles, tmp_path):
    week1 = [b for b in bundles if b.name.endswith("week01.zip")][:2]
    book.import_bundles(week1, course)
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the killed regrade's leftovers stay in tmp_path
    proc = _start(REGRADER, course.root, book.path, env=env)
    _wait_for(proc, "grading learner001")  # learner000 is verified and stored by now
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _wait_for_orphans(tmp_path)
    dump(book.path)  # integrity_check ok
    verified = [r for r in book.snapshot()["results"] if r[2] == "verified"]
    assert len(verified) == 1, "the finished regrade is stored, the interrupted one left no trace"
    done = regrade(book, course, week="1")
    assert [r.submission.learner for r in done] == ["learner001"], "a rerun picks up where the kill left off"
    for r in done:
        solved = members(week1[1])["files/answer.py"].decode() == synthetic.SOLUTION
        assert r.verified.complete == solved and not r.disagreements
    assert regrade(book, course, week="1") == [], "verified on this machine already"


def _wait_for_orphans(folder, timeout=60):
    """A SIGKILLed regrade leaves its grader subprocess running until it finishes; wait for ours to end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ours = [p for p in os.listdir("/proc") if p.isdigit() and _mentions(p, str(folder))]
        if not ours:
            return
        time.sleep(0.2)
    for pid in ours:
        os.kill(int(pid), signal.SIGKILL)


def _mentions(pid, text):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return text.encode() in fh.read()
    except OSError:
        return False


def _grade(*statuses, kind="correctness"):
    checks = [CheckResult(id=f"c{i}", title="", kind=k, needs=n, status=s)
              for i, (s, k, n) in enumerate(statuses)]
    return GradeResult(week="week01", tier="cpu", device="d", fingerprint="f", started_at="t", seconds=0,
                       checks=checks)


def test_compare_reports_only_checks_both_machines_could_judge():
    mine = _grade(("passed", "correctness", "cpu"), ("passed", "performance", "cuda"), ("passed", "report", "cpu"),
                  ("failed", "correctness", "cpu"))
    theirs = _grade(("failed", "correctness", "cpu"), ("blocked", "performance", "cuda"), ("failed", "report", "cpu"),
                    ("failed", "correctness", "cpu"))
    assert [d["check"] for d in compare(mine, theirs, same_machine=True)] == ["c0", "c2"]
    assert [d["check"] for d in compare(mine, theirs, same_machine=False)] == ["c0"], \
        "a report states the learner's machine: another machine cannot re-verify it"
    assert compare(mine, mine, same_machine=True) == []
