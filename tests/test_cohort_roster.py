"""Who submitted what and when: a roster with per-learner secrets, signed bundles, the gradebook's own receipt
time, deadlines and the late policy, self-reported claims refused or kept as claims, LMS exports, the
similarity signal, and a version-1 gradebook migrated in place."""
import csv
import fnmatch
import json
import textwrap
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

import pytest

from infracourse.cohort import synthetic
from infracourse.cohort.bundle import BundleError, read_bundle, submit
from infracourse.cohort.export import export
from infracourse.cohort.gradebook import Gradebook, GradebookError
from infracourse.cohort.roster import RosterError, format_secret, read_roster, write_secrets
from infracourse.cohort.similarity import similar
from infracourse.cohort.standing import cohort_standing
from infracourse.workspace import Workspace

from cohort_support import members, rezip

GPU, GPU_CEILINGS = synthetic.DEVICES[1]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return synthetic.write_course(tmp_path_factory.mktemp("course"), weeks=3, kernel_weeks=(2,))


@pytest.fixture
def book(course, tmp_path):
    """A gradebook with a roster of four learners (learner003 never submits)."""
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    assert book.import_roster(read_roster(synthetic.write_roster(tmp_path / "roster.csv", 4))) == (4, 0)
    return book


@pytest.fixture
def keys(book):
    return {learner.id: key for learner, key in book.roster()}


@pytest.fixture
def signed(course, keys, tmp_path):
    return synthetic.write_cohort(course, tmp_path / "bundles", learners=3, missing=0, keys=keys)


def _relabel(path, out, **changes):
    """The bundle with manifest fields changed (hashes still consistent): what a forger would send."""
    files = members(path)
    manifest = json.loads(files["manifest.json"]) | changes
    return rezip(out, {**files, "manifest.json": json.dumps(manifest).encode()})


def test_roster_rows_are_checked_and_secrets_written_privately(book, tmp_path):
    bad = tmp_path / "bad.csv"
    for text, says in (("name,email\nAda,ada@x\n", "lacks id"), ("id,name,email\n../ada,Ada,ada@x\n", "not a learner id"),
                       ("id,name,email\nada,Ada,ada@x\nbob,Bob,ADA@x\n", "e-mail 'ada@x' is already on line 2"),
                       ("id,name,email\nada,Ada,nope\n", "not an e-mail")):
        bad.write_text(text)
        with pytest.raises(RosterError, match=says):
            read_roster(bad)
    keys = dict((learner.id, key) for learner, key in book.roster())
    again = tmp_path / "again.csv"
    again.write_text("id,name,email\nlearner000,Renamed,new@uni.example\n")
    assert book.import_roster(read_roster(again)) == (0, 1)
    assert dict((lr.id, k) for lr, k in book.roster()) == keys, "a roster update never changes a secret"
    written = write_secrets(book.roster(), tmp_path / "secrets")
    assert len(written) == 4 and written[0].read_text().strip() == format_secret("learner000", keys["learner000"])
    assert stat.S_IMODE(written[0].stat().st_mode) == 0o600
    with pytest.raises(RosterError, match="not empty"):
        write_secrets(book.roster(), tmp_path / "secrets")


def test_only_a_bundle_signed_by_its_roster_learner_is_accepted(book, course, signed, tmp_path):
    stolen = _relabel(signed[0], tmp_path / "stolen.zip", learner="learner001")  # learner000's pass, as learner001
    unsigned = synthetic.write_cohort(course, tmp_path / "unsigned", learners=1, missing=0)[0]
    stranger = _relabel(unsigned, tmp_path / "stranger.zip", learner="mallory")
    report = book.import_bundles([stolen, unsigned, stranger, *signed], course, keep_going=True)
    reasons = {e.source: (e.kind, e.reason) for e in report.rejected}
    assert reasons[str(stolen)][0] == "signature" and "does not match" in reasons[str(stolen)][1]
    assert reasons[str(unsigned)][0] == "signature" and "unsigned" in reasons[str(unsigned)][1]
    assert reasons[str(stranger)][0] == "unknown-learner" and "not on the roster" in reasons[str(stranger)][1]
    assert len(report.imported) == len(signed) and all(i.signed for i in report.imported)


def test_without_a_roster_the_cli_path_refuses_unless_unsigned(course, tmp_path):
    book = Gradebook.create(tmp_path / "open.db", course)
    bundles = synthetic.write_cohort(course, tmp_path / "b", learners=1, missing=0)
    with pytest.raises(GradebookError, match="has no roster"):
        book.import_bundles(bundles, course, require_roster=True)
    report = book.import_bundles(bundles, course)  # --unsigned
    assert report.committed and not any(i.signed for i in report.imported)


def test_receipt_time_orders_submissions_and_judges_lateness(book, course, keys, tmp_path):
    lab = course.lab("week01")
    digest = synthetic.graders_digest(lab)
    hw = synthetic._CPU

    def bundle(name, solved, claimed):
        result = synthetic.result_for(lab, hw, None, solved=solved, share=1, started_at=claimed[:-1])
        fields = dict(learner="learner000", week="week01", created_at=claimed, infracourse_version="x",
                      graders_sha256=digest, environment=hw.as_dict(), ceilings=None)
        return synthetic.write_bundle(tmp_path / name, fields, {"answer.py": synthetic.SOLUTION.encode() if solved
                                                                else synthetic.STARTER.encode()},
                                      result.as_dict(), key=bytes.fromhex(keys["learner000"]))

    first = bundle("first.zip", True, "2026-02-01T10:00:00Z")
    future = bundle("future.zip", False, "2099-01-01T00:00:00Z")  # claims to be newest
    assert book.import_bundles([first], course, received_at="2026-02-01T12:00:00Z").committed
    assert book.import_bundles([future], course, received_at="2026-02-03T12:00:00Z").committed
    newest = book.latest_submissions(week="week01", learner="learner000")[0]
    assert newest.submitted_at == "2026-02-03T12:00:00Z", "the gradebook's clock, not the learner's"
    (tmp_path / "cohort.yaml").write_text("deadlines:\n  week01: 2026-02-02T00:00:00Z\n  week02: 2026-01-01T00:00:00Z\n"
                                          "late:\n  policy: penalty\n  grace_hours: 12\n  penalty_per_day: 0.25\n")
    rows = _rows(export(book, course, tmp_path / "grades.csv"))
    cell = rows["learner000", "week01"]
    assert cell["late"] == "True" and cell["late_hours"] == "36.0" and cell["points"] == "", "not regraded: no points"
    book.record_verified(newest.id, read_bundle(first, course).results, {}, None, [])  # as a regrade would
    cell = _rows(export(book, course, tmp_path / "grades.csv"))["learner000", "week01"]
    assert cell["points"] == "75.0", "a full pass, one started day past the 12 h grace: 25 % off"
    assert _rows(export(book, course, tmp_path / "grades.csv"))["learner003", "week02"]["points"] == "0"


def _rows(path):
    with open(path, newline="") as fh:
        return {(r["learner"], r["week"]): r for r in csv.DictReader(fh)}


def test_never_submitted_learners_appear_and_lms_exports_have_their_columns(book, course, signed, tmp_path):
    assert book.import_bundles(signed, course).committed
    rows = _rows(export(book, course, tmp_path / "grades.csv"))
    assert rows["learner003", "week01"]["state"] == "none" and rows["learner003", "week01"]["on_roster"] == "True"
    assert "learner003" in cohort_standing(book, course).learners
    with open(export(book, course, tmp_path / "canvas.csv", format="canvas"), newline="") as fh:
        canvas = list(csv.reader(fh))
    assert canvas[0][:6] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "infracourse week01: Answer 1"]
    assert canvas[1][:6] == ["Points Possible", "", "", "", "", "100"] and len(canvas) == 2 + 4
    assert canvas[2][:5] == ["Learner 0", "", "S100000", "", "section 1"]
    with open(export(book, course, tmp_path / "moodle.csv", format="moodle"), newline="") as fh:
        moodle = list(csv.reader(fh))
    assert moodle[0][:4] == ["Email address", "ID number", "Full name", "infracourse week01: Answer 1"]
    assert moodle[4][:3] == ["learner003@uni.example", "ID00003", "Learner 3"] and moodle[4][3:] == ["", "", ""]


@pytest.mark.parametrize("case, change, says", [
    ("invented check", lambda r: r["checks"].append({**r["checks"][0], "id": "bonus"}), "'bonus' is not in"),
    ("check twice", lambda r: r["checks"].append(dict(r["checks"][0])), "appears twice"),
    ("5000 % of ceiling", lambda r: r["checks"][2]["figures"]["bandwidth"].update(fraction_of_ceiling=50.0),
     "claims 50.0 of its device's ceiling"),
    ("negative rate", lambda r: r["checks"][2]["figures"]["bandwidth"].update(value=-3.0), "never negative"),
    ("negative time", lambda r: r.update(seconds=-1.0), "grade time -1.0"),
])
def test_impossible_self_reports_are_refused_at_import(course, tmp_path, case, change, says):
    book = Gradebook.create(tmp_path / "g.db", course)
    good = synthetic.write_cohort(course, tmp_path / "b", learners=4, missing=0, seed=3)
    source = next(p for p in good if p.name.endswith("week02.zip") and
                  json.loads(members(p)["results.json"])["checks"][2]["figures"])
    files = members(source)
    result = json.loads(files["results.json"])
    change(result)
    forged = rezip(tmp_path / "forged.zip", {**files, "results.json": json.dumps(result).encode()}, rehash=True)
    report = book.import_bundles([forged], course)
    assert [e.kind for e in report.rejected] == ["claims"] and says in report.rejected[0].reason


def test_leaderboard_scores_regraded_figures_only(book, course, keys, tmp_path):
    lab = course.lab("week02")
    result = synthetic.result_for(lab, GPU, GPU_CEILINGS, solved=True, share=1.2, started_at="2026-02-01T10:00:00")
    fields = dict(learner="learner000", week="week02", created_at="2026-02-01T10:00:00Z", infracourse_version="x",
                  graders_sha256=synthetic.graders_digest(lab), environment=GPU.as_dict(), ceilings=None)
    path = synthetic.write_bundle(tmp_path / "fast.zip", fields, {"answer.py": synthetic.SOLUTION.encode()},
                                  result.as_dict(), key=bytes.fromhex(keys["learner000"]))
    assert book.import_bundles([path], course).committed
    cell = cohort_standing(book, course).cell("learner000", "week02")
    assert cell.best["bandwidth"].normalised == 1.2 and cell.best["bandwidth"].origin == "self"
    assert cell.score is None, "a self-reported figure is shown, never ranked"
    sub = book.latest_submissions(week="week02", learner="learner000")[0]
    regraded = synthetic.result_for(lab, GPU, GPU_CEILINGS, solved=True, share=0.7, started_at="2026-02-02T10:00:00")
    book.record_verified(sub.id, regraded, GPU.as_dict(), None, [])
    assert cohort_standing(book, course).cell("learner000", "week02").score == pytest.approx(0.7)


def test_submit_signs_with_the_learners_secret(course, tmp_path):
    ws = Workspace.init(tmp_path / "ws")
    ws.unlock(course, course.week("week01"))
    ws.progress.record(synthetic.result_for(course.lab("week01"), synthetic._CPU, None, solved=False, share=0,
                                            started_at="2026-02-01T10:00:00"))
    key = "ab" * 32
    (tmp_path / "ada.secret").write_text(format_secret("ada", key) + "\n")
    path = submit(ws, course, "1", secret_file=tmp_path / "ada.secret", hardware=synthetic._CPU)
    manifest = read_bundle(path, course).manifest
    assert manifest.learner == "ada" and manifest.signed_by(bytes.fromhex(key)), "the id comes from the secret"
    with pytest.raises(BundleError, match="issued to 'ada', not 'bob'"):
        submit(ws, course, "1", learner="bob", secret_file=tmp_path / "ada.secret", hardware=synthetic._CPU)
    (tmp_path / "bad.secret").write_text("ada:1234\n")
    with pytest.raises(BundleError, match="not an infracourse secret"):
        submit(ws, course, "1", secret_file=tmp_path / "bad.secret", hardware=synthetic._CPU)


def test_a_version_1_gradebook_is_migrated_when_opened(course, tmp_path):
    book = Gradebook.create(tmp_path / "old.db", course)
    assert book.import_bundles(synthetic.write_cohort(course, tmp_path / "b", learners=1, missing=0), course).committed
    with closing(sqlite3.connect(book.path)) as db, db:  # back to the version-1 layout
        db.execute("DROP TABLE roster")
        db.execute("ALTER TABLE submissions DROP COLUMN received_at")
        db.execute("ALTER TABLE submissions DROP COLUMN signed")
        db.execute("PRAGMA user_version = 1")
    migrated = Gradebook(book.path)
    with closing(sqlite3.connect(book.path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
        assert db.execute("SELECT COUNT(*) FROM submissions WHERE received_at = imported_at").fetchone()[0] == 3
    assert migrated.roster() == [] and len(migrated.latest_submissions()) == 3


def test_similar_flags_copies_and_renamed_copies_not_independent_work(course, tmp_path):
    book = Gradebook.create(tmp_path / "g.db", course)
    lab = course.lab("week01")
    original = Path(textwrap.__file__).read_text()  # real code of some size
    renamed = original.replace("text", "txt").replace("width", "w").replace("#", "# note:")
    own = Path(fnmatch.__file__).read_text()
    sources = {"ada": original, "bob": original, "cy": renamed, "dee": own}
    paths = []
    for learner, code in sources.items():
        result = synthetic.result_for(lab, synthetic._CPU, None, solved=True, share=1, started_at="2026-02-01T10:00:00")
        fields = dict(learner=learner, week="week01", created_at="2026-02-01T10:00:00Z", infracourse_version="x",
                      graders_sha256=synthetic.graders_digest(lab), environment=synthetic._CPU.as_dict(), ceilings=None)
        paths.append(synthetic.write_bundle(tmp_path / f"{learner}.zip", fields, {"answer.py": code.encode()},
                                            result.as_dict()))
    assert book.import_bundles(paths, course).committed
    found = {(m.kind, m.learners) for m in similar(book, course)}
    assert ("identical", ("ada", "bob")) in found and ("renamed", ("ada", "bob", "cy")) in found
    assert not any("dee" in learners for _, learners in found)
