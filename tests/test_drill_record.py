"""Drill results on their way to the instructor: `submit` puts the learner's per-topic drill record in the
bundle (drills.json, hashed and signed like every member), `cohort import` accepts bundles without one (older
engines) and refuses a malformed one naming the file and the fix, all or nothing, and the published site shows
per-topic accuracy across the cohort."""
import json

import pytest

from infracourse.cohort import synthetic
from infracourse.cohort.bundle import BundleError, read_bundle, submit
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.publish import publish
from infracourse.drills import record

from cohort_support import dump, members
from test_cohort_bundle import course, graded  # noqa: F401 - fixtures: a generated course, a graded workspace

GPU = synthetic.DEVICES[1][0]


@pytest.fixture
def drilled(graded):
    """test_cohort_bundle's graded workspace (week02) with five drill answers over two topics."""
    for question, topic, correct in (("kv-cache-bytes", "kv-cache", True), ("kv-per-token", "kv-cache", False),
                                     ("kv-max-tokens", "kv-cache", True),
                                     ("ring-allreduce-time", "collectives", False),
                                     ("busbw-factor", "collectives", True)):
        graded.progress.record_drill(question, 7, "week02", topic, "drill", correct, "1 GB", 3.0)
    return graded


def _cohort(course, out, learners=3) -> list[list]:
    """Each learner's bundles (one per built week), as synthetic.write_cohort writes them."""
    paths, weeks = synthetic.write_cohort(course, out, learners=learners, missing=0), len(course.labs())
    return [paths[i:i + weeks] for i in range(0, len(paths), weeks)]


def _with_drills(path, drills):
    """The same learner's bundle written again with a drill record (hashed and listed as submit does)."""
    from infracourse.cohort.bundle import FILES, MANIFEST, RESULTS, write_bundle

    found = members(path)
    manifest = json.loads(found[MANIFEST])
    fields = {k: manifest[k] for k in ("learner", "week", "created_at", "infracourse_version", "graders_sha256",
                                       "environment", "ceilings")}
    files = {n[len(FILES):]: b for n, b in found.items() if n.startswith(FILES)}
    return write_bundle(path.with_name("drills-" + path.name), fields, files, json.loads(found[RESULTS]),
                        drills=drills)


def test_submit_carries_the_drill_record_per_topic(course, drilled):
    path = submit(drilled, course, "week02", learner="ada", hardware=GPU)
    assert "drills.json" in members(path) and "drills.json" in json.loads(members(path)["manifest.json"])["files"]
    bundle = read_bundle(path, course)
    assert bundle.drills == {"format_version": 1, "answered": 5, "right": 3,
                             "by_topic": {"collectives": {"right": 1, "answered": 2},
                                          "kv-cache": {"right": 2, "answered": 3}}}
    assert "reply" not in members(path)["drills.json"].decode() and "1 GB" not in members(path)["drills.json"].decode()


def test_a_learner_without_drills_submits_as_before(course, graded):
    path = submit(graded, course, "week02", learner="bea", hardware=GPU)
    assert "drills.json" not in members(path) and read_bundle(path, course).drills is None


MALFORMED = {
    "more right than answered": ({"format_version": 1, "answered": 2, "right": 3,
                                  "by_topic": {"kv-cache": {"right": 3, "answered": 2}}}, "3 right out of 2"),
    "totals that do not add up": ({"format_version": 1, "answered": 9, "right": 1,
                                   "by_topic": {"kv-cache": {"right": 1, "answered": 2}}}, "answered is 9"),
    "a fractional count": ({"format_version": 1, "answered": 2.5, "right": 1,
                            "by_topic": {"kv-cache": {"right": 1, "answered": 2.5}}}, "not a whole number"),
    "a topic with markup": ({"format_version": 1, "answered": 1, "right": 1,
                             "by_topic": {"<script>": {"right": 1, "answered": 1}}}, "is not a topic name"),
    "an unknown field": ({"format_version": 1, "answered": 0, "right": 0, "by_topic": {}, "grade": 100},
                         "unknown field(s) ['grade']"),
    "a newer format": ({"format_version": 2, "answered": 0, "right": 0, "by_topic": {}}, "format_version 2"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_drill_record_is_refused_naming_file_and_fix(course, tmp_path, case):
    data, says = MALFORMED[case]
    path = _with_drills(_cohort(course, tmp_path / "in", learners=1)[0][0], data)
    with pytest.raises(BundleError) as exc:
        read_bundle(path, course)
    message = str(exc.value)
    assert exc.value.kind == "drills" and str(path) in message and "drills.json is malformed" in message
    assert says in message and "infracourse submit" in message, message


def test_not_json_is_refused_too():
    with pytest.raises(record.RecordError, match="not JSON"):
        record.parse(b"{broken")
    with pytest.raises(record.RecordError, match="not an object"):
        record.parse(b"[1, 2]")


def test_import_keeps_old_bundles_and_refuses_a_bad_record_all_or_nothing(course, tmp_path):
    old = sum(_cohort(course, tmp_path / "old", learners=2), [])  # no drills.json: as before it existed
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    assert book.import_bundles(old, course).committed, "bundles without a drill record import as before"
    assert book.drill_accuracy()["learners"] == 0
    before = dump(book.path)

    fresh = _cohort(course, tmp_path / "new", learners=3)
    good = _with_drills(fresh[0][0], record.summary([{"topic": "kv-cache", "correct": True}]))
    bad = _with_drills(fresh[1][0], {"format_version": 1, "answered": 1, "right": 2,
                                  "by_topic": {"kv-cache": {"right": 2, "answered": 1}}})
    report = book.import_bundles([good, bad], course)
    assert not report.committed and [e.kind for e in report.rejected] == ["drills"]
    assert str(bad) in str(report.rejected[0]) and "drills.json" in str(report.rejected[0])
    assert dump(book.path) == before, "a refused import records nothing and loses nothing"
    assert book.import_bundles([good], course).committed
    assert book.drill_accuracy()["learners"] == 1


def test_cohort_accuracy_per_topic_from_each_learners_newest_record(course, tmp_path):
    paths = _cohort(course, tmp_path / "in", learners=3)  # [learner][week]
    rows = lambda *answers: [{"topic": t, "correct": c} for t, c in answers]  # noqa: E731
    bundles = [
        _with_drills(paths[0][0], record.summary(rows(("kv-cache", False)))),  # learner 0's older record ...
        _with_drills(paths[0][1], record.summary(rows(("kv-cache", True), ("kv-cache", True), ("moe", False)))),
        _with_drills(paths[1][0], record.summary(rows(("kv-cache", False), ("collectives", True)))),
        paths[2][0],  # learner 2: no record at all
    ]
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    for i, path in enumerate(bundles):  # one import each: learner 0's week02 is received later, so newest
        assert book.import_bundles([path], course, received_at=f"2026-02-0{i + 1}T10:00:00Z").committed
    accuracy = book.drill_accuracy()
    assert (accuracy["learners"], accuracy["answered"], accuracy["right"]) == (2, 5, 3)
    assert accuracy["by_topic"] == {
        "collectives": {"learners": 1, "answered": 1, "right": 1, "accuracy": 1.0},
        "kv-cache": {"learners": 2, "answered": 3, "right": 2, "accuracy": 2 / 3},
        "moe": {"learners": 1, "answered": 1, "right": 0, "accuracy": 0.0}}

    site = publish(book, course, tmp_path / "site")
    index = (site / "index.html").read_text()
    assert 'id="drills"' in index and "kv-cache" in index and "67%" in index and "2 learner(s) with a drill" in index
    assert json.loads((site / "cohort.json").read_text())["drills"] == json.loads(json.dumps(accuracy))


def test_a_cohort_without_drill_records_publishes_no_drills_section(course, tmp_path):
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    assert book.import_bundles(_cohort(course, tmp_path / "in", learners=1)[0], course).committed
    site = publish(book, course, tmp_path / "site")
    assert 'id="drills"' not in (site / "index.html").read_text()
    assert "drills" not in json.loads((site / "cohort.json").read_text())
