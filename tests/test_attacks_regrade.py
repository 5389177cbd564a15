"""`cohort regrade` against a hostile bundle (issue 9), and what happens where no sandbox works: the regrade
refuses unless the instructor allows it, such results are marked, and a learner's own grade still works
and says it ran unsandboxed."""
from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from infracourse import sandbox
from infracourse.cli import app
from infracourse.cohort import synthetic
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.regrade import regrade

from cohort_support import dump, members, rezip
from test_attacks import Attacker, assert_contained

cli = CliRunner()


@pytest.fixture
def cohort(tmp_path):
    """A one-week generated course, three learners' bundles imported into a gradebook."""
    course = synthetic.write_course(tmp_path / "course", weeks=1, kernel_weeks=())
    bundles = synthetic.write_cohort(course, tmp_path / "bundles", learners=3, missing=0)
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    return course, bundles, book


@pytest.fixture
def no_sandbox(monkeypatch):
    monkeypatch.setenv("INFRACOURSE_NO_SANDBOX", "1")
    sandbox.status.cache_clear()
    yield
    monkeypatch.delenv("INFRACOURSE_NO_SANDBOX")
    sandbox.status.cache_clear()


@pytest.mark.skipif(not sandbox.status().available, reason="needs the sandbox")
def test_hostile_bundle_changes_nothing_and_leaves_nothing_running(cohort, tmp_path):
    course, bundles, book = cohort
    attacker = Attacker(tmp_path, course.root, "answer.py", ["answers", "is-int"])
    attacker.guard(*bundles[1:], secret=True)  # the other learners' bundles, on disk
    attacker.guard(book.path, secret=True)
    files = members(bundles[0])
    files["files/answer.py"] = attacker.source("answer.py").encode()
    rezip(bundles[0], files, rehash=True)
    report = book.import_bundles(bundles, course)
    assert report.committed, report.rejected
    attacker.protected.remove(book.path)  # the regrade writes its results there: compared by content below
    before, rows_before = attacker.hashes(), set(dump(book.path))
    try:
        done = {r.submission.learner: r for r in regrade(book, course)}
        assert_contained(attacker, done["learner000"].verified, before)
    finally:
        attacker.survivors()  # kills any, even when an assertion failed
        attacker.close()
    rows_after = set(dump(book.path))
    assert rows_before <= rows_after, "the regrade removed or changed recorded rows"
    assert all(r.startswith(('INSERT INTO "results"', 'INSERT INTO "figures"')) for r in rows_after - rows_before)
    for i in (1, 2):  # the others graded on their own merits (bundles come in learner order)
        solved = members(bundles[i])["files/answer.py"].decode() == synthetic.SOLUTION
        verified = done[f"learner{i:03d}"].verified
        assert verified.complete == solved and verified.sandboxed


def test_regrade_refuses_without_a_sandbox_unless_allowed_and_marks_the_results(cohort, tmp_path, monkeypatch,
                                                                                no_sandbox):
    course, bundles, book = cohort
    book.import_bundles(bundles, course)
    monkeypatch.setenv("INFRACOURSE_COURSE", str(course.root))
    monkeypatch.chdir(tmp_path)
    before = dump(book.path)
    refused = cli.invoke(app, ["cohort", "regrade"])
    assert refused.exit_code == 2 and "--allow-unsandboxed" in refused.output and "no sandbox" in refused.output
    assert dump(book.path) == before, "a refused regrade records nothing"
    allowed = cli.invoke(app, ["cohort", "regrade", "--learner", "learner001", "--allow-unsandboxed"])
    assert allowed.exit_code == 0 and "(unsandboxed)" in allowed.output, allowed.output
    assert cli.invoke(app, ["cohort", "export", "--out", "grades.csv"]).exit_code == 0
    rows = {r["learner"]: r for r in csv.DictReader(open(tmp_path / "grades.csv"))}
    assert rows["learner001"]["verified"] == "True" and rows["learner001"]["verified_sandboxed"] == "False"
    assert rows["learner000"]["verified_sandboxed"] == ""  # not verified at all


def test_own_grade_works_unsandboxed_and_says_so(tmp_path, monkeypatch, no_sandbox):
    from test_runner import FIXTURE, GOOD

    monkeypatch.setenv("INFRACOURSE_COURSE", str(FIXTURE))
    ws = tmp_path / "ws"
    assert cli.invoke(app, ["init", str(ws)]).exit_code == 0
    assert cli.invoke(app, ["unlock", "week01", "--workspace", str(ws)]).exit_code == 0
    (ws / "week01" / "probe.py").write_text(GOOD)
    graded = cli.invoke(app, ["grade", "week01", "--workspace", str(ws)])
    assert graded.exit_code == 0, graded.output
    assert "ran unsandboxed" in " ".join(graded.output.split())
    doctor = cli.invoke(app, ["doctor", "--json"])
    assert json.loads(doctor.output)["sandbox"] == {"available": False, "describe": sandbox.status().describe()}
    assert "INFRACOURSE_NO_SANDBOX" in sandbox.status().describe()
