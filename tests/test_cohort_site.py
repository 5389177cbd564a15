"""The published cohort site: byte-for-byte against a golden folder, crawled in a real headless Chromium,
pseudonyms that hide learner ids, and a small-size run of the benchmark's cohort.

Regenerate the golden folder after an intended change with INFRACOURSE_UPDATE_GOLDENS=1, then review its diff.
"""
import csv
import difflib
import json
import os
import re
import shutil

import pytest

from infracourse.cohort import synthetic
from infracourse.cohort.export import export
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.publish import PublishError, publish
from infracourse.cohort.regrade import compare

from cohort_support import crawl, members, rezip
from conftest import REPO

GOLDEN = REPO / "tests" / "goldens" / "cohort_site"
GENERATED_AT = "2026-03-01 12:00 UTC"


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """Six learners x three weeks (week02 a kernel week), some missing, two of them regraded: one agrees,
    one's self-report disagrees with the verified result."""
    root = tmp_path_factory.mktemp("cohort")
    course = synthetic.write_course(root / "course", weeks=3, kernel_weeks=(2,))
    book = Gradebook.create(root / "gradebook.db", course)
    book.import_bundles(synthetic.write_cohort(course, root / "bundles", learners=6, seed=8, missing=0.2), course)
    lab = course.lab("week01")
    for sub in book.latest_submissions(week="week01")[:2]:
        (_, self_reported), = book.results_of(sub.id, "self")
        verified = synthetic.result_for(lab, synthetic.DEVICES[3][0], None, solved=sub.learner != "learner000",
                                        share=0, started_at="2026-02-20T09:00:00")
        book.record_verified(sub.id, verified, synthetic.DEVICES[3][0].as_dict(), None,
                             compare(self_reported, verified, same_machine=False))
    return course, book


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_site_matches_the_golden_folder(cohort, tmp_path):
    course, book = cohort
    site = publish(book, course, tmp_path / "site", generated_at=GENERATED_AT)
    if os.environ.get("INFRACOURSE_UPDATE_GOLDENS"):
        shutil.rmtree(GOLDEN, ignore_errors=True)
        shutil.copytree(site, GOLDEN)
    got, want = _files(site), _files(GOLDEN)
    assert sorted(got) == sorted(want), "pages differ: INFRACOURSE_UPDATE_GOLDENS=1 regenerates after a change"
    for name in want:
        diff = "".join(difflib.unified_diff(want[name].splitlines(True), got[name].splitlines(True), "golden", "now",
                                            n=1))
        assert not diff, f"{name} differs from the golden copy:\n{diff[:3000]}"


def test_site_shows_disagreement_and_normalised_performance(cohort, tmp_path):
    course, book = cohort
    site = publish(book, course, tmp_path / "site", generated_at=GENERATED_AT)
    week1 = (site / "weeks" / "week01.html").read_text()
    assert "answers: self passed, verified failed" in week1 and "not regraded" in week1
    week2 = (site / "weeks" / "week02.html").read_text()
    assert 'id="leaderboard"' in week2 and "GB/s" in week2 and "of each learner's device ceiling" in week2
    assert 'id="leaderboard"' not in week1, "a week without performance checks has no leaderboard"
    data = json.loads((site / "cohort.json").read_text())
    shares = [f["fraction_of_ceiling"] for r in data["rows"] for f in r["best_figures"].values()]
    assert shares and all(0 <= s <= 1.1 for s in shares)


def test_site_works_in_headless_chromium(cohort, tmp_path):
    course, book = cohort
    site = publish(book, course, tmp_path / "site", generated_at=GENERATED_AT)
    pages = crawl(site, tmp_path / "profile")
    assert len(pages) == 1 + 3 + 6, "the index, a page per week and per learner, each reached by a link"


def _learners(site):
    return list((site / "learners").glob("*.html"))


def test_pseudonyms_hide_learner_ids_and_stay_stable(cohort, tmp_path):
    course, book = cohort
    first = publish(book, course, tmp_path / "site", pseudonyms=True, generated_at=GENERATED_AT)
    text = "\n".join(_files(first).values())
    assert not re.search(r"learner00\d", text), "no learner id in a pseudonymous site"
    names = sorted(p.name for p in _learners(first))
    assert len(names) == 6 and all(n.startswith("learner-") for n in names)
    again = publish(book, course, tmp_path / "site", pseudonyms=True, generated_at=GENERATED_AT)
    assert sorted(p.name for p in _learners(again)) == names, "republishing keeps each learner's pseudonym"
    export(book, course, tmp_path / "grades.csv")
    assert "learner000" in (tmp_path / "grades.csv").read_text(), "the instructor's export keeps real ids"


def test_csv_export_defuses_spreadsheet_formulas(cohort, tmp_path):
    course, book = cohort
    good = synthetic.write_cohort(course, tmp_path / "bundles", learners=8, seed=8, missing=0)[-1]
    files = members(good)
    results = json.loads(files["results.json"])
    results["device"] = '=HYPERLINK("http://evil.example","GPU")'
    forged = rezip(tmp_path / "forged.zip", {**files, "results.json": json.dumps(results).encode()}, rehash=True)
    fresh = Gradebook.create(tmp_path / "gradebook.db", course)
    assert fresh.import_bundles([forged], course).committed
    rows = list(csv.DictReader(open(export(fresh, course, tmp_path / "grades.csv"))))
    assert [r["device"] for r in rows if r["device"]] == ["'" + results["device"]]


def test_publish_never_replaces_a_folder_that_is_not_a_site(cohort, tmp_path):
    course, book = cohort
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(PublishError, match="holds files that are not a published site"):
        publish(book, course, tmp_path / "home")
    assert (tmp_path / "home" / "thesis.tex").read_text() == "precious"


def test_small_cohort_of_24_weeks_imports_and_publishes(tmp_path):
    """The benchmark's cohort at 20 learners (benchmarks/cohort_scale.py runs 500 and is timed there)."""
    course = synthetic.write_course(tmp_path / "course")
    bundles = synthetic.write_cohort(course, tmp_path / "bundles", learners=20)
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    report = book.import_bundles(bundles, course)
    site = publish(book, course, tmp_path / "site")
    assert report.committed and len(report.imported) == len(bundles) > 20 * 24 * 0.9
    index = (site / "index.html").read_text()
    assert index.count('<td class="cell ') == 20 * 24
    assert len(list((site / "weeks").glob("week*.html"))) == 24 and len(_learners(site)) == 20
    rows = json.loads((site / "cohort.json").read_text())["rows"]
    assert len(rows) == 20 * 24 and sum(r["state"] != "none" for r in rows) == len(bundles)
