"""A term on week 7, through the CLI: the instructor releases the course; one learner solves the lab and
submits, another submits the starter with a forged all-passed grade; the instructor imports, regrades,
exports and publishes, and the site shows who was verified and who disagrees."""
import csv
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infracourse.cli import app
from infracourse.cohort import synthetic
from infracourse.cohort.release import release
from infracourse.course import Course
from infracourse.workspace import Workspace

from cohort_support import crawl
from conftest import REPO

runner = CliRunner()
WEEK07 = REPO / "labs" / "week07-triton-basics"


def invoke(*args, ws=None):
    return runner.invoke(app, [str(a) for a in args], env={"INFRACOURSE_WORKSPACE": str(ws) if ws else None},
                         catch_exceptions=False)


@pytest.mark.slow
def test_submit_import_regrade_export_publish(tmp_path, monkeypatch, machine):
    solution = {p.name: p.read_bytes() for p in (WEEK07 / "solution").iterdir()}  # a learner release skips here
    learner_course = release(REPO, tmp_path / "learner-course").out
    monkeypatch.setenv("INFRACOURSE_COURSE", str(learner_course))  # learners work from the release

    # the instructor's roster, and a secret for each learner to sign their bundles with
    instructor = tmp_path / "instructor"
    instructor.mkdir()
    monkeypatch.chdir(instructor)
    assert invoke("cohort", "init").exit_code == 0
    (instructor / "roster.csv").write_text("id,name,email\nalice@uni.example,Alice,alice@uni.example\n"
                                           "bob,Bob,bob@uni.example\n")
    assert invoke("cohort", "roster", "import", "roster.csv").exit_code == 0
    issued = invoke("cohort", "roster", "secrets", "--out", "secrets")
    assert issued.exit_code == 0, issued.output
    secret = {who: next((instructor / "secrets").glob(f"{who}*.secret")) for who in ("alice@uni.example", "bob")}

    alice = tmp_path / "alice"
    assert invoke("init", alice).exit_code == 0 and invoke("unlock", "week07", ws=alice).exit_code == 0
    for name, data in solution.items():
        (alice / "week07" / name).write_bytes(data)
    assert invoke("report", "7", ws=alice).exit_code == 0
    assert invoke("grade", "7", ws=alice).exit_code == 0
    submitted = invoke("submit", "7", "--learner", "alice@uni.example", "--secret-file", secret["alice@uni.example"],
                       ws=alice)
    assert submitted.exit_code == 0, submitted.output
    alice_zip = Path(submitted.output.strip())
    assert alice_zip.parent == alice / "submissions" and alice_zip.is_file()

    bob = tmp_path / "bob"
    invoke("init", bob)
    invoke("unlock", "7", ws=bob)
    (bob / ".infracourse" / "config.yaml").write_text("format_version: 1\nlearner: bob\n")
    refused = invoke("submit", "7", ws=bob)
    assert refused.exit_code == 2 and "no grade yet: run `infracourse grade week07` first" in refused.output
    forged = synthetic.result_for(Course(learner_course).lab("week07"), machine, None, solved=True, share=0,
                                  started_at="2026-02-01T10:00:00")
    Workspace(bob).progress.record(forged)  # bob claims every check passed
    bob_zip = Path(invoke("submit", "week07", "--secret-file", secret["bob"], ws=bob).output.strip())

    monkeypatch.setenv("INFRACOURSE_COURSE", str(REPO))  # the instructor's own course, solutions and all
    imported = invoke("cohort", "import", alice_zip, bob_zip)
    assert imported.exit_code == 0 and "imported 2 bundle(s)" in imported.output, imported.output
    again = invoke("cohort", "import", shutil.copy(alice_zip, tmp_path / "resent.zip"))
    assert again.exit_code == 1 and "already imported" in again.output and "gradebook is as it was" in again.output

    regraded = invoke("cohort", "regrade")
    assert regraded.exit_code == 0 and "regraded 2 submission(s)" in regraded.output
    assert "alice" in regraded.output and "bob" in regraded.output
    assert "regraded 0 submission(s)" in invoke("cohort", "regrade").output, "verified here already"

    assert invoke("cohort", "export", "--out", "grades.csv").exit_code == 0
    rows = {r["learner"]: r for r in csv.DictReader(open("grades.csv")) if r["week"] == "week07"}
    alice_row, bob_row = rows["alice@uni.example"], rows["bob"]
    assert alice_row["state"] == "verified" and alice_row["verified"] == "True" and alice_row["disagreements"] == ""
    cpu_checks = sum(c.needs == "cpu" for c in Course(REPO).lab("week07").spec.checks)
    assert alice_row["self_passed"] == alice_row["verified_passed"]
    assert machine.gpu_count or alice_row["self_passed"] == str(cpu_checks), "every CPU check, on both sides"
    assert alice_row["graders_match"] == "True", "the release's graders are the instructor's"
    assert bob_row["state"] == "disagrees" and "report: self passed, verified failed" in bob_row["disagreements"]
    assert invoke("cohort", "export", "--out", "grades.json").exit_code == 0
    data = json.loads(Path("grades.json").read_text())
    assert {(r["learner"], r["week"]) for r in data["rows"]} == {(l, w["id"]) for l in ("alice@uni.example", "bob")
                                                                for w in data["weeks"]}

    published = invoke("cohort", "publish", "--out", "site")
    assert published.exit_code == 0 and "file://" in published.output
    week = Path("site/weeks/week07.html").read_text()
    assert "add-correct: self passed, verified failed" in week and "alice@uni.example" in week
    crawl(Path("site"), tmp_path / "profile")
