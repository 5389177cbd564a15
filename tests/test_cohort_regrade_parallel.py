"""`cohort regrade` at scale (issue 13): one bad submission never stops the rest, worker processes in
parallel (one per GPU, pinned), a worker that dies costs only its submission, and learner files left by a
kill -9 are removed by the next regrade."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from contextlib import closing
from dataclasses import replace

import psutil
import pytest

from infracourse.cohort import synthetic, workers
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.regrade import regrade
from infracourse.hardware import detect

from cohort_support import members, rezip


@pytest.fixture
def cohort(tmp_path, monkeypatch):
    """Two weeks x four learners imported; this test's own temp dir, so scratch is inspected in isolation."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the workers' too
    (tmp_path / "tmp").mkdir()
    course = synthetic.write_course(tmp_path / "course", weeks=2, kernel_weeks=())
    bundles = synthetic.write_cohort(course, tmp_path / "bundles", learners=4, missing=0)
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    assert book.import_bundles(bundles, course).committed
    return course, bundles, book


def _replace_bundle(book, learner, week, data: bytes):
    """What an older infracourse let in, or a disk that rotted: the stored bundle itself is bad."""
    with closing(sqlite3.connect(book.path)) as db, db:
        db.execute("UPDATE submissions SET bundle = ? WHERE learner = ? AND week = ?", (data, learner, week))


def _solved(bundle) -> bool:
    return members(bundle)["files/answer.py"].decode() == synthetic.SOLUTION


def test_every_bad_submission_is_an_error_with_its_reason_and_the_rest_are_graded(cohort, tmp_path):
    course, bundles, book = cohort
    by_name = {b.stem: b for b in bundles}
    _replace_bundle(book, "learner000", "week01", b"not a zip at all")
    files = members(by_name["learner001-week01"])
    files["files/" + "n" * 300 + ".py"] = b"x = 1\n"  # longer than any file system allows a name
    _replace_bundle(book, "learner001", "week01", rezip(tmp_path / "long.zip", files, rehash=True).read_bytes())
    files = members(by_name["learner002-week01"])
    results = json.loads(files["results.json"])
    results["checks"][0]["status"] = "great"  # a malformed grader line in the learner's results
    _replace_bundle(book, "learner002", "week01", rezip(tmp_path / "bad.zip", {**files, "results.json":
                                                        json.dumps(results).encode()}, rehash=True).read_bytes())
    files = members(by_name["learner003-week01"])
    results = json.loads(files["results.json"])
    results["checks"].append({**results["checks"][0], "id": "invented"})  # a check id the lab does not have
    _replace_bundle(book, "learner003", "week01", rezip(tmp_path / "extra.zip", {**files, "results.json":
                                                        json.dumps(results).encode()}, rehash=True).read_bytes())
    (course.root / "labs" / "week02-answer" / "lab.yaml").write_text("checks: [")  # every week02 grade crashes

    done = {(r.submission.learner, r.submission.week): r for r in regrade(book, course, workers=2)}

    assert len(done) == 8, "every submission has its result"
    graded = done["learner003", "week01"]  # the invented check is the learner's claim, ignored: graded as usual
    assert not graded.error and graded.verified.complete == _solved(by_name["learner003-week01"])
    assert "not a readable zip" in done["learner000", "week01"].error
    assert "File name too long" in done["learner001", "week01"].error
    assert "results.json is not a grade result" in done["learner002", "week01"].error
    for learner in ("learner000", "learner001", "learner002", "learner003"):
        error = done[learner, "week02"].error
        assert error and "lab.yaml" in error, error
        assert [c.id for c in done[learner, "week02"].verified.checks] == ["regrade"]
    for (learner, week), r in done.items():
        assert not r.verified.complete or not r.error
        if r.error:
            assert {c.status for c in r.verified.checks} == {"error"}
            assert all(r.error in c.message for c in r.verified.checks), "each check says why"
    snap = book.snapshot()
    assert sum(row[2] == "verified" for row in snap["results"]) == 8, "each one stored, one row each"
    assert regrade(book, course, workers=2) == [], "a rerun does not stop on them again: they are recorded"
    again = regrade(book, course, workers=1, again=True, learner="learner001", week="1")
    assert len(again) == 1 and "File name too long" in again[0].error
    assert workers.scratch_root().is_dir() and not os.listdir(workers.scratch_root()), "no learner file left"


def test_a_good_submission_grades_the_same_in_parallel(cohort):
    course, bundles, book = cohort
    done = regrade(book, course, workers=2, week="1")
    assert len(done) == 4 and not any(r.error for r in done)
    for r, bundle in zip(sorted(done, key=lambda r: r.submission.learner), [b for b in bundles if "week01" in b.name]):
        assert r.verified.complete == _solved(bundle)


def test_a_worker_that_dies_costs_only_its_submission(cohort):
    course, bundles, book = cohort
    killed = []

    def kill_the_worker_once_it_grades(sub):
        if killed:
            return

        def watch():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for proc in psutil.Process().children():
                    if "infracourse.cohort.workers" in " ".join(proc.cmdline()) and proc.children():
                        killed.append(sub.learner)
                        proc.send_signal(signal.SIGKILL)  # mid-grade: its grader is running
                        return
                time.sleep(0.05)
        killed.append(None)
        threading.Thread(target=watch, daemon=True).start()

    done = {r.submission.learner: r for r in regrade(book, course, workers=1, week="1",
                                                     on_submission=kill_the_worker_once_it_grades)}
    victim = killed[1]
    assert victim == "learner000" and len(done) == 4
    assert "worker process died" in done[victim].error and "SIGKILL" in done[victim].error
    others = [r for learner, r in done.items() if learner != victim]
    assert not any(r.error for r in others), "a fresh worker graded the rest"


def test_gpus_are_shared_out_one_per_worker_by_default(monkeypatch):
    machine = replace(detect(), gpu_count=4, gpu_name="Fake GPU")
    hw, count = workers.plan(machine, None)
    assert (count, hw.gpu_count) == (4, 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [workers._gpus_of(i, hw, 4) for i in range(4)] == ["0", "1", "2", "3"]
    hw, count = workers.plan(machine, 2)
    assert (count, hw.gpu_count) == (2, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the machine was already restricted: keep to those
    assert [workers._gpus_of(i, hw, 4) for i in range(2)] == ["4,5", "6,7"]
    assert workers.plan(replace(machine, gpu_count=0), None)[1] == 1
    assert workers._gpus_of(0, replace(hw, gpu_count=0), 0) is None


REGRADER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from infracourse.cohort.gradebook import Gradebook
    from infracourse.cohort.regrade import regrade
    from infracourse.course import Course
    course, book = sys.argv[1:]
    regrade(Gradebook(Path(book)), Course(Path(course)), workers=2,
            on_submission=lambda sub: print("grading", sub.learner, sub.week, flush=True))
""")


def test_kill_9_of_a_regrade_leaves_no_process_and_the_next_one_removes_its_files(cohort, tmp_path):
    course, bundles, book = cohort
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen([sys.executable, "-c", REGRADER, str(course.root), str(book.path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    root = workers.scratch_root()
    try:
        deadline = time.monotonic() + 60
        while not list(root.glob("*/**/answer.py")):  # learner files unpacked by a worker
            assert time.monotonic() < deadline and proc.poll() is None, "no worker unpacked a submission"
            time.sleep(0.05)
        family = psutil.Process(proc.pid).children(recursive=True)
        assert family, "the regrade's workers and graders"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    gone, alive = psutil.wait_procs(family, timeout=30)
    for p in alive:
        p.kill()
    assert not alive, f"outlived the regrade: {[p.pid for p in alive]}"
    left = list(root.iterdir())
    assert left and any(folder.rglob("answer.py") for folder in left), "the kill left learner files behind"
    done = regrade(book, course, workers=2, week="1")  # sweeps first, then grades what was not recorded
    assert done and not any(r.error for r in done)
    assert not list(root.iterdir()), "the next regrade removed them"
