"""The published cohort site: byte-for-byte against a golden folder, crawled in a real headless Chromium,
the dashboard's grid, rates, stuck list, drill-down and its sort/filter driven in that browser, pseudonyms
that hide learner ids, and a small-size run of the benchmark's cohort.

Regenerate the golden folder after an intended change with INFRACOURSE_UPDATE_GOLDENS=1, then review its diff.
Regenerate the dashboard screenshots in docs/img with `python tests/test_cohort_site.py` (needs chromium).
"""
import csv
import difflib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from infracourse import __version__
from infracourse.cohort import synthetic
from infracourse.cohort.bundle import graders_digest, write_bundle
from infracourse.cohort.export import export
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.publish import PublishError, publish
from infracourse.cohort.outcome import compare
from infracourse.course import Course

sys.path.insert(0, str(Path(__file__).parent))
from cohort_support import Chromium, crawl, members, publish_with_learner_text, rezip  # noqa: E402
from conftest import REPO  # noqa: E402

GOLDEN = REPO / "tests" / "goldens" / "cohort_site"
TERM_START = datetime(2026, 1, 5, tzinfo=timezone.utc)


def term(root: Path, *, learners: int, seed: int, weeks: int = 10, kernel_weeks=(3, 5, 7), planned: int = 14,
         reached: int = 6, unsandboxed: float = 0.02, disagree: float = 0.04) -> tuple[Course, Gradebook, datetime]:
    """A cohort mid-term: `weeks` built weeks and `planned` planned ones; learners have reached week `reached`
    (a few stopped earlier: idle), retry failing weeks (some fail the same checks again and again), and the
    instructor regraded most newest submissions on a GPU or a CPU machine (a share `unsandboxed` without the
    sandbox), a share `disagree` of the learner's passing reports contradicted by the regrade. Returns the course, the gradebook and "now": two
    days after week `reached` was due."""
    course = synthetic.write_course(root / "course", weeks=weeks, kernel_weeks=kernel_weeks)
    syllabus_file = course.root / "curriculum" / "syllabus.yaml"
    syllabus = yaml.safe_load(syllabus_file.read_text())
    syllabus["weeks"] += [{"id": f"week{n:02d}", "phase": "Generated", "title": f"Planned {n}",
                           "objectives": ["later"], "hours": 1, "lab": "planned"}
                          for n in range(weeks + 1, weeks + planned + 1)]
    syllabus_file.write_text(yaml.safe_dump(syllabus, sort_keys=False))
    course = Course(course.root)
    rng = random.Random(seed)
    labs = [(lab, graders_digest(lab), (lab.path / "README.md").read_bytes()) for lab in course.labs()]
    received_at, skills = {}, {}  # the gradebook's receipt time -> bundles it received then
    (root / "bundles").mkdir(parents=True)
    for i in range(learners):
        learner = f"learner{i:03d}"
        hardware, ceilings = synthetic.DEVICES[rng.randrange(len(synthetic.DEVICES))]
        skills[learner] = skill = rng.random()
        reach = reached if rng.random() < 0.85 else rng.randrange(1, reached)
        for n, (lab, digest, handout) in enumerate(labs[:reach], start=1):
            when = TERM_START + timedelta(days=7 * n, hours=-rng.randrange(2, 96))
            for attempt in range(1, 5):
                solved = rng.random() < 0.3 + 0.65 * skill
                result = synthetic.result_for(lab, hardware, ceilings, solved=solved,
                                              share=min(1.1, skill * rng.uniform(0.6, 1.2)),
                                              started_at=when.strftime("%Y-%m-%dT%H:%M:%S"))
                fields = dict(learner=learner, week=lab.spec.week, created_at=result.started_at + "Z",
                              infracourse_version=__version__, graders_sha256=digest,
                              environment=hardware.as_dict(), ceilings=asdict(ceilings) if ceilings else None)
                files = {"answer.py": (synthetic.SOLUTION if solved else synthetic.STARTER).encode(),
                         "README.md": handout}
                received = when.strftime("%Y-%m-%dT%H:%M:%SZ")
                received_at.setdefault(received, []).append(write_bundle(
                    root / "bundles" / f"{learner}-{lab.spec.week}-{attempt}.zip", fields, files, result.as_dict()))
                if solved or rng.random() < 0.35:
                    break
                when += timedelta(hours=rng.randrange(3, 40))
    book = Gradebook.create(root / "gradebook.db", course)
    for when, paths in sorted(received_at.items()):
        assert book.import_bundles(paths, course, received_at=when).committed
    for sub in book.latest_submissions():
        if rng.random() > 0.7:
            continue
        (_, self_reported), = book.results_of(sub.id, "self")
        lab = course.lab(sub.week)
        hardware, ceilings = synthetic.DEVICES[0] if rng.random() < 0.5 else synthetic.DEVICES[3]
        solved = all(c.status == "passed" for c in self_reported.checks if c.kind == "correctness") \
            and rng.random() >= disagree
        verified = synthetic.result_for(lab, hardware, ceilings, solved=solved, share=skills[sub.learner],
                                        started_at="2026-02-19T09:00:00")
        verified.sandboxed = rng.random() >= unsandboxed
        book.record_verified(sub.id, verified, hardware.as_dict(), asdict(ceilings) if ceilings else None,
                             compare(self_reported, verified, same_machine=False))
    return course, book, TERM_START + timedelta(days=7 * reached + 2)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """Eight learners x four built weeks (week03 a kernel week) and three planned ones, mid-term."""
    return term(tmp_path_factory.mktemp("cohort"), learners=8, seed=13, weeks=4, kernel_weeks=(3,), planned=3,
                reached=4, unsandboxed=0.1, disagree=0.2)


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_site_matches_the_golden_folder(cohort, tmp_path):
    course, book, now = cohort
    site = publish(book, course, tmp_path / "site", now=now)
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
    course, book, now = cohort
    site = publish(book, course, tmp_path / "site", now=now)
    week1, week3 = ((site / "weeks" / f"week0{n}.html").read_text() for n in (1, 3))
    assert "answers: self passed, verified failed" in week3 and "not regraded" in week1
    assert 'id="leaderboard"' in week3 and "GB/s" in week3 and "of each learner's device ceiling" in week3
    assert 'id="leaderboard"' not in week1, "a week without performance checks has no leaderboard"
    data = json.loads((site / "cohort.json").read_text())
    shares = [f["fraction_of_ceiling"] for r in data["rows"] for f in r["best_figures"].values()]
    assert shares and all(0 <= s <= 1.1 for s in shares)


def test_site_works_in_headless_chromium(cohort, tmp_path):
    course, book, now = cohort
    site = publish(book, course, tmp_path / "site", now=now)
    pages = crawl(site, tmp_path / "profile")
    assert len(pages) == 1 + 4 + 8, "the index, a page per built week and per learner, each reached by a link"


def _section(site, id_):
    """The index page's HTML from the heading or box with that id to the next section heading."""
    index = (site / "index.html").read_text()
    start = index.index(f'id="{id_}"')
    end = index.find("<h2", start + 1)
    return index[start:end if end > 0 else None]


def test_dashboard_shows_grid_first_rates_stuck_and_drill_down(cohort, tmp_path):
    course, book, now = cohort
    site = publish(book, course, tmp_path / "site", now=now)
    index = (site / "index.html").read_text()
    order = [index.index(f'id="{i}"') for i in ("grid", "stuck", "weeks", "planned")]
    assert order == sorted(order), "the grid comes first; planned weeks last"
    grid = _section(site, "grid")
    assert "week05" not in grid and "Planned" not in grid, "planned weeks are not columns of the grid"
    assert re.findall(r'<th data-sort="week0\d" class="week">.*?<small[^>]*>(\d+%)</small>', grid) \
        == ["62%", "75%", "12%", "50%"], "each week's header carries its pass rate"
    assert grid.count('<td class="mark ') == 8 * 4
    for mark in ("m-verified", "m-cpu", "m-self", "m-failing", "m-disagrees", "m-none", "unsandboxed"):
        assert mark in grid, f"the fixture shows {mark}"
    assert "◆" in grid and "○" in grid and "✗" in grid, "marks carry a symbol, not only a colour"
    stuck = _section(site, "stuck")
    assert "failed answers, is-int in each of the last 3 submissions" in stuck
    assert "no submission for 26 days" in stuck
    weeks = _section(site, "weeks")
    assert re.search(r"week03</a>.*?12%", weeks, re.S), "per-week pass rate"
    page = (site / "learners" / "learner004.html").read_text()
    assert 'href="learners/learner004.html#week03"' in stuck and '<section id="week03"' in page
    week3 = page[page.index('<section id="week03"'):]
    week3 = week3[:week3.index("</section>")]
    assert "answers <small>answer() is 42</small></td><td>failed" in week3 and "see the grader" in week3
    assert week3.count("<tr><td class=\"num\">") == 3, "the timeline lists the three submissions"
    fewer = publish(book, course, tmp_path / "other", now=now, stuck_attempts=2, idle_days=30)
    assert "no submission for" not in _section(fewer, "stuck") and "last 2 submissions" in _section(fewer, "stuck")


def _visible(browser) -> list[str]:
    return json.loads(browser.call("Runtime.evaluate", session=True, returnByValue=True, expression=(
        "JSON.stringify([...document.querySelectorAll('#grid-table tbody tr')].filter(r => !r.hidden)"
        ".map(r => r.cells[0].dataset.v))"))["result"]["value"])


def _load(browser, url):
    """Load `url` afresh (by way of about:blank, so a hash-only change is a real page load too)."""
    for target in ("about:blank", url):
        browser.events.clear()
        browser.call("Page.navigate", session=True, url=target)
        browser.wait_for("Page.loadEventFired")


def test_dashboard_sorts_and_filters_in_chromium(cohort, tmp_path):
    """Sort and filter run in the browser from the URL's hash and from the controls; without script the
    page still shows every row (and hides the controls that would not work)."""
    course, book, now = cohort
    site = publish(book, course, tmp_path / "site", now=now)
    stuck = set(re.findall(r'<a href="learners/(learner\d+)\.html', _section(site, "stuck")))
    last = {m[1]: m[2] for m in re.finditer(r'data-v="(learner\d+)">.*?<td data-v="([^"]*)" class="last"',
                                              (site / "index.html").read_text(), re.S)}
    url = (site / "index.html").resolve().as_uri()
    browser = Chromium(tmp_path / "profile")
    try:
        _load(browser, url)
        assert _visible(browser) == [f"learner{i:03d}" for i in range(8)]
        _load(browser, url + "#show=stuck&sort=last&desc=1")
        shown = _visible(browser)
        assert set(shown) == stuck and shown == sorted(shown, key=lambda n: last[n], reverse=True)
        evaluate = lambda js: browser.call("Runtime.evaluate", session=True, expression=js, returnByValue=True)
        evaluate("const f = document.getElementById('controls'); f.elements.show.value = '';"
                 "f.elements.q.value = '00'; f.dispatchEvent(new Event('input'))")
        assert len(_visible(browser)) == 8 and "q=00" in evaluate("location.hash")["result"]["value"]
        evaluate("document.getElementById('controls').elements.q.value = '7';"
                 "document.getElementById('controls').dispatchEvent(new Event('input'))")
        assert _visible(browser) == ["learner007"]
        _load(browser, url)
        evaluate("document.querySelector('th[data-sort=\"week03\"] small').click()")
        order = _visible(browser)
        ranks = json.loads(evaluate("JSON.stringify([...document.querySelectorAll('#grid-table tbody tr')]"
                                    ".map(r => Number(r.cells[5].dataset.v)))")["result"]["value"])
        assert ranks == sorted(ranks, reverse=True) and "sort=week03" in evaluate("location.hash")["result"]["value"]
        assert order[0] == "learner005", "week03's only passing learner (verified on CPU only) sorts first"
        browser.call("Emulation.setScriptExecutionDisabled", session=True, value=True)
        _load(browser, url + "#show=stuck")
        assert _visible(browser) == [f"learner{i:03d}" for i in range(8)], "without script every row shows"
        assert evaluate("document.getElementById('controls').hidden")["result"]["value"] is True
    finally:
        browser.close()


def _learners(site):
    return list((site / "learners").glob("*.html"))


def test_pseudonyms_hide_learner_ids_and_stay_stable(cohort, tmp_path):
    course, book, now = cohort
    first = publish(book, course, tmp_path / "site", pseudonyms=True, now=now)
    text = "\n".join(_files(first).values())
    assert not re.search(r"learner00\d", text), "no learner id in a pseudonymous site"
    names = sorted(p.name for p in _learners(first))
    assert len(names) == 8 and all(n.startswith("learner-") for n in names)
    again = publish(book, course, tmp_path / "site", pseudonyms=True, now=now)
    assert sorted(p.name for p in _learners(again)) == names, "republishing keeps each learner's pseudonym"
    export(book, course, tmp_path / "grades.csv")
    assert "learner000" in (tmp_path / "grades.csv").read_text(), "the instructor's export keeps real ids"


def test_csv_export_defuses_spreadsheet_formulas(cohort, tmp_path):
    course, book, now = cohort
    good = synthetic.write_cohort(course, tmp_path / "bundles", learners=8, seed=8, missing=0)[-1]
    files = members(good)
    results = json.loads(files["results.json"])
    results["device"] = '=HYPERLINK("http://evil.example","GPU")'
    forged = rezip(tmp_path / "forged.zip", {**files, "results.json": json.dumps(results).encode()}, rehash=True)
    fresh = Gradebook.create(tmp_path / "gradebook.db", course)
    assert fresh.import_bundles([forged], course).committed
    rows = list(csv.DictReader(open(export(fresh, course, tmp_path / "grades.csv"))))
    assert [r["device"] for r in rows if r["device"]] == ["'" + results["device"]]


def test_learner_text_is_never_rendered_as_html(cohort, tmp_path):
    """A self-reported check message and device name are the learner's to write: the site shows them as
    text, and the dashboard's script only reads text (Chromium finds no element the learner injected)."""
    course, *_ = cohort
    payload = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
    site = publish_with_learner_text(course, tmp_path, payload)
    text = "\n".join(t for name, t in _files(site).items() if name.endswith(".html"))
    assert "<img" not in text and "<script>document" not in text and "&lt;img src=x" in text
    pages = crawl(site, tmp_path / "profile")
    assert not any("pwned" in facts["title"] for facts in pages.values())


def test_publish_never_replaces_a_folder_that_is_not_a_site(cohort, tmp_path):
    course, book, now = cohort
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
    assert index.count('<td class="mark ') == 20 * 24
    assert len(list((site / "weeks").glob("week*.html"))) == 24 and len(_learners(site)) == 20
    rows = json.loads((site / "cohort.json").read_text())["rows"]
    assert len(rows) == 20 * 24 and sum(r["state"] != "none" for r in rows) == len(bundles)


def screenshots(out: Path, work: Path) -> list[Path]:
    """The dashboard at 20 and 500 learners, a filtered and sorted view, and a stuck learner's drill-down page,
    as PNGs in `out` (look at them after a change to the site)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    shots = []
    for learners, size in ((20, "1280,1000"), (500, "1400,1000")):
        shutil.rmtree(work / str(learners), ignore_errors=True)
        course, book, now = term(work / str(learners), learners=learners, seed=5)
        site = publish(book, course, work / str(learners) / "site", now=now)
        views = [("index.html", "")]
        if learners == 20:
            stuck_row = re.search(r'<a href="learners/([^"#]+)\.html#(week\d+)">', _section(site, "stuck"))
            views.append((f"learners/{stuck_row[1]}.html", ""))
        else:
            views.append(("index.html", "#show=stuck&sort=last"))
        for page, hash_ in views:
            view = "dashboard" if page == "index.html" else "learner"
            name = f"{view}-{learners}{'-' + re.sub(r'[^a-z]+', '-', hash_[1:]) if hash_ else ''}.png"
            subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                            "--hide-scrollbars", f"--screenshot={out / name}", f"--window-size={size}",
                            (site / page).resolve().as_uri() + hash_], check=True, capture_output=True, timeout=120)
            shots.append(out / name)
    return shots


if __name__ == "__main__":
    for shot in screenshots(REPO / "docs" / "img", Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/dashboard")):
        print(shot)
