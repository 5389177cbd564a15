"""Weeks 22-24 in the cohort: a learner on the platform track grades and submits week 22; the bundle's signed
manifest names the track; the instructor imports it and regrades it against that track's project as staged for
week 22 (the same checks as the learner's grade); a bundle whose track was taken out is refused; standing,
export and similarity read the track; `cohort verify-certificate` reports a certificate's claims the
gradebook's regrades do not bear out (a week not regraded counts as not graded) and accepts one they do.
One real grade on each side (~10-20 s each on a CPU); everything else reads what they made."""
import json
import shutil

import pytest
from typer.testing import CliRunner

from infracourse import completion
from infracourse.cli import app
from infracourse.cohort import regrade, roster
from infracourse.cohort.bundle import BundleError, read_bundle, submit
from infracourse.cohort.export import export
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.similarity import similar
from infracourse.cohort.standing import cohort_standing
from infracourse.course import Course
from infracourse.grading.report import stamp_environment
from infracourse.grading.runner import grade
from infracourse.workspace import Workspace

from cohort_support import dump, members, rezip
from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.solutions]
TRACK = "platform"
WEEK22 = {"environment-pinned", "run-command", "project-plan", "fifo-baseline"}  # curriculum/tracks/platform.yaml
runner = CliRunner()


def test_a_track_submission_through_the_gradebook(tmp_path_factory, machine, tmp_path, monkeypatch):
    """One test, so that the two grades run once whatever the number of xdist workers."""
    term = make_term(tmp_path_factory, machine)
    bundle_names_the_track_and_signs_it(term)
    regrade_grades_the_tracks_week22_staging(term)
    project_bundle_without_its_track_is_refused_at_import(term, tmp_path)
    standing_export_and_similarity_read_the_track(term, tmp_path)
    verify_certificate(term, tmp_path, monkeypatch)


def make_term(tmp_path_factory, machine):
    """The learner's graded, signed week-22 submission imported into a gradebook with a roster, and the
    gradebook as it was before the regrade (a copy), then after it."""
    root = tmp_path_factory.mktemp("tracks")
    course = Course(REPO)
    book = Gradebook.create(root / "gradebook.db", course)
    book.import_roster([roster.Learner("ada", "Ada", "ada@uni.example")])
    secret = next(p for p in roster.write_secrets(book.roster(), root / "secrets") if p.suffix == ".secret")

    ws = Workspace.init(root / "ada")
    learner_course = Course(REPO)
    ws.choose_track(learner_course, TRACK)
    ws.unlock(learner_course, learner_course.week("week22"))
    lab = learner_course.lab("week22")
    assert lab.track == TRACK and {c.id for c in lab.spec.checks} == WEEK22
    shutil.copytree(lab.solution, ws.root / "project", dirs_exist_ok=True)
    stamp_environment(ws.root / "project" / lab.spec.report, machine)  # what `infracourse report` does
    mine = grade(learner_course, lab, ws.root / "project", hardware=machine)
    assert mine.complete, [(c.id, c.status, c.message) for c in mine.checks]
    ws.progress.record(mine)
    zip_path = submit(ws, Course(REPO, track=ws.track), "week22", learner="ada", secret_file=secret, hardware=machine)

    report = book.import_bundles([zip_path], course, require_roster=True)
    assert report.committed and not report.rejected, report.rejected
    before = shutil.copy(book.path, root / "before-regrade.db")
    done = regrade.regrade(book, Course(REPO), hardware=machine)
    return {"root": root, "book": book, "before": Gradebook(before), "zip": zip_path, "mine": mine, "done": done,
            "key": bytes.fromhex(dict((who.id, key) for who, key in book.roster())["ada"]), "ws": ws}


def bundle_names_the_track_and_signs_it(term):
    bundle = read_bundle(term["zip"], Course(REPO))
    m = bundle.manifest
    assert (m.week, m.track, m.learner) == ("week22", TRACK, "ada")
    assert m.signed_by(term["key"]), "signed with the learner's secret"
    assert b'"track":"platform"' in m.signed_bytes(), "the track is covered by the signature"
    forged = m.model_copy(update={"track": "nvidia"})
    assert not forged.signed_by(term["key"]), "another track under the same signature is caught"
    assert {c.id for c in bundle.results.checks} == WEEK22


def regrade_grades_the_tracks_week22_staging(term):
    [done] = term["done"]
    assert done.error is None, done.error
    assert done.submission.track == TRACK
    verified = {c.id: c.status for c in done.verified.checks}
    assert verified == {c.id: c.status for c in term["mine"].checks}, "the same checks, the same statuses"
    assert set(verified) == WEEK22 and done.disagreements == []
    assert done.verified.week == "week22"


def project_bundle_without_its_track_is_refused_at_import(term, tmp_path):
    files = members(term["zip"])
    manifest = json.loads(files["manifest.json"])
    del manifest["track"]
    stripped = rezip(tmp_path / "stripped.zip", {**files, "manifest.json": json.dumps(manifest).encode()})
    before = dump(term["book"].path)
    report = term["book"].import_bundles([stripped], Course(REPO), require_roster=True)
    assert not report.committed and dump(term["book"].path) == before
    [problem] = report.rejected
    assert isinstance(problem, BundleError) and problem.kind == "track"
    assert "week22 is a week of the direction project but manifest.json names no track" in str(problem)
    assert "infracourse track choose" in str(problem) and str(problem).startswith(str(stripped))


def standing_export_and_similarity_read_the_track(term, tmp_path):
    course = Course(REPO)  # no track of its own: each learner's comes from their submission
    cell = cohort_standing(term["book"], course).cell("ada", "week22")
    assert cell.track == TRACK and cell.graders_match and cell.verified and cell.verified_complete
    assert cell.verified_passed == cell.verified_total == len(WEEK22)
    out = export(term["book"], course, tmp_path / "grades.json")
    row = next(r for r in json.loads(out.read_text())["rows"] if (r["learner"], r["week"]) == ("ada", "week22"))
    assert row["state"] == "verified" and row["graders_match"] is True and row["track"] == TRACK
    assert similar(term["book"], course, week="week22") == []  # one learner: nothing to match, and no error


def _verify(cert: dict, path, gradebook) -> "object":
    path.write_text(json.dumps(cert))
    return runner.invoke(app, ["cohort", "verify-certificate", str(path), "--gradebook", str(gradebook)],
                         catch_exceptions=False)


def verify_certificate(term, tmp_path, monkeypatch):
    monkeypatch.setenv("INFRACOURSE_COURSE", str(REPO))
    course = Course(REPO, track=TRACK)
    honest = completion.certificate(course, {"week22": term["mine"]}, learner="ada", track=TRACK)
    claimed = {b["check"] for c in honest["criteria"] for b in c["backing"] if b["status"] == "passed"}
    assert {"environment-pinned", "run-command"} <= claimed, "week 22 backs the reproducibility criterion"

    # before the regrade, week 22 is not graded in the gradebook: its passes are not borne out
    early = _verify(honest, tmp_path / "early.json", term["before"].path)
    assert early.exit_code == 1, early.output
    assert "week22:environment-pinned is 'passed' on the certificate but 'not graded'" in early.output
    assert "no submission of ada is regraded yet" in early.output

    ok = _verify(honest, tmp_path / "honest.json", term["book"].path)
    assert ok.exit_code == 0, ok.output
    assert "verified" in ok.output and "week(s) week22" in ok.output

    forged = json.loads(json.dumps(honest))  # claims the whole criterion met, every backing check passed
    criterion = next(c for c in forged["criteria"] if any(b["week"] == "week22" for b in c["backing"]))
    criterion["state"] = completion.MET
    for b in criterion["backing"]:
        b["status"] = "passed"
    bad = _verify(forged, tmp_path / "forged.json", term["book"].path)
    assert bad.exit_code == 1, bad.output
    assert f"{criterion['id']}: the certificate says 'met', the gradebook's grades say not met" in bad.output
    assert "week05:resume-losses is 'passed' on the certificate but 'not graded'" in bad.output
    assert "week22:environment-pinned is 'passed'" not in bad.output, "week 22 is verified: only the rest is owed"

    other = dict(honest, track="nvidia")
    assert _verify(other, tmp_path / "other.json", term["book"].path).exit_code == 1


@pytest.mark.parametrize("content, says", [("{not json", "not JSON"),
                                            ('{"kind": "something-else", "criteria": []}',
                                             "not an infracourse completion certificate"),
                                            ('[1, 2]', "not an infracourse completion certificate")])
def test_verify_certificate_bad_input_names_the_file(tmp_path, monkeypatch, content, says):
    monkeypatch.setenv("INFRACOURSE_COURSE", str(REPO))
    Gradebook.create(tmp_path / "gradebook.db", Course(REPO))
    (tmp_path / "completion.json").write_text(content)
    done = runner.invoke(app, ["cohort", "verify-certificate", str(tmp_path / "completion.json"),
                               "--gradebook", str(tmp_path / "gradebook.db")])
    assert done.exit_code == 2, done.output
    assert says in done.output and "completion.json" in done.output


def test_submit_of_a_project_week_without_a_track_says_to_choose_one(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRACOURSE_COURSE", str(REPO))
    Workspace.init(tmp_path / "ws")
    done = runner.invoke(app, ["submit", "22", "--learner", "ada"], env={"INFRACOURSE_WORKSPACE": str(tmp_path / "ws")})
    assert done.exit_code == 2, done.output
    assert "week22 is a week of the direction project, and this workspace has no track chosen" in done.output
    assert "infracourse track choose NAME" in done.output
