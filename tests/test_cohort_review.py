"""`cohort review`: rubric scoring in a local web app, driven over real HTTP against a served app (uvicorn on
127.0.0.1, in a thread): the token, localhost only, learner text escaped, per-reviewer scores with optimistic
concurrency and an audit trail, refusals that lose nothing, `--status` and the export's points."""
from __future__ import annotations

import csv
import http.client
import http.cookiejar
import json
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from contextlib import closing, contextmanager
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from infracourse import __version__
from infracourse.cohort import export, rubric, synthetic
from infracourse.cohort.bundle import graders_digest, write_bundle
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.review import Review, bound_server, login_url
from infracourse.course import Course
from infracourse.syllabus import CourseFileError, load_lab

RUBRIC = [
    {"id": "conclusion", "title": "The conclusion follows from the figures", "section": "Conclusion and limits",
     "criterion": "explain-trade-offs", "levels": {0: "missing", 1: "stated", 2: "argued from the figures"}},
    {"id": "limits", "title": "Where it does not apply", "section": "Conclusion and limits",
     "levels": {0: "missing", 1: "generic", 2: "a concrete case", 3: "a concrete case, measured"}},
]
HOSTILE = ("# Report\n\n## Conclusion and limits\n\n<script>document.title='pwned'</script>\n"
           "<img src=x onerror=\"document.title='pwned'\">\n[click](javascript:alert(1)) ![plot](plot.png)\n")


def _course(root: Path) -> Course:
    """The generated course, week01 asking for a report and carrying RUBRIC; week02 (a kernel week) has none."""
    synthetic.write_course(root, weeks=2, kernel_weeks=(2,))
    lab = root / "labs" / "week01-answer"
    spec = yaml.safe_load((lab / "lab.yaml").read_text())
    spec |= {"files": ["answer.py", "report.md"], "report": {"file": "report.md", "prose": ["Conclusion and limits"]},
             "rubric": RUBRIC}
    (lab / "lab.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for side in ("starter", "solution"):
        (lab / side / "report.md").write_text("# Report\n\n## Conclusion and limits\n\nTODO\n")
    syllabus = yaml.safe_load((root / "curriculum" / "syllabus.yaml").read_text())
    syllabus["completion"] = [{"id": "explain-trade-offs", "text": "Explains trade-offs.", "checks": ["week01:answers"]}]
    (root / "curriculum" / "syllabus.yaml").write_text(yaml.safe_dump(syllabus, sort_keys=False))
    return Course(root)


def _bundle(course: Course, out: Path, learner: str, week: str, report: str) -> Path:
    lab = course.lab(week)
    hardware, ceilings = synthetic.DEVICES[0]
    result = synthetic.result_for(lab, hardware, ceilings, solved=True, share=0.8, started_at="2026-02-01T10:00:00")
    fields = dict(learner=learner, week=week, created_at="2026-02-01T10:00:00Z", infracourse_version=__version__,
                  graders_sha256=graders_digest(lab), environment=hardware.as_dict(), ceilings=asdict(ceilings))
    files = {"answer.py": synthetic.SOLUTION.encode(), "report.md": report.encode(), "plot.png": b"\x89PNG fake"}
    return write_bundle(out / f"{learner}-{week}.zip", fields, files, result.as_dict())


@pytest.fixture()
def cohort(tmp_path):
    course = _course(tmp_path / "course")
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    (tmp_path / "in").mkdir()
    bundles = [_bundle(course, tmp_path / "in", f"learner{i}", "week01", HOSTILE if i == 0 else
                       f"# Report\n\n## Conclusion and limits\n\nLearner {i} concludes.\n") for i in range(3)]
    bundles.append(_bundle(course, tmp_path / "in", "learner0", "week02", "no rubric here"))
    assert book.import_bundles(bundles, course).committed
    return book, course


class Browser:
    """One reviewer's browser: a cookie jar and JSON helpers over urllib (no third-party client needed)."""

    def __init__(self, base: str):
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> tuple[int, str]:
        try:
            with self.opener.open(path if path.startswith("http") else self.base + path) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def put(self, path: str, body: object, content_type: str = "application/json") -> tuple[int, dict]:
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="PUT",
                                         headers={"Content-Type": content_type})
        try:
            with self.opener.open(request) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def score(self, sid: int, item: str, points, comment: str = "", base=None) -> tuple[int, dict]:
        return self.put(f"/api/submissions/{sid}/scores/{item}", {"points": points, "comment": comment, "base": base})


@contextmanager
def served(review: Review):
    server, sock = bound_server(review)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the review app did not start"
        time.sleep(0.02)
    try:
        yield sock, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        review.plots.close()


def _login(sock, review: Review, reviewer: str) -> Browser:
    browser = Browser(f"http://127.0.0.1:{sock.getsockname()[1]}")
    status, page = browser.get(login_url(sock, review, reviewer))
    assert status == 200 and "Review queue" in page, page
    return browser


def _week01(book: Gradebook) -> list[int]:
    return [s.id for s in book.latest_submissions(week="week01")]


def test_lab_yaml_rubric_is_validated_and_every_shipped_week_has_one(tmp_path):
    course = Course()
    criteria = {c.id for c in course.syllabus.completion}
    labs = course.labs() + [course.lab("week24", track=t) for t in course.tracks]
    for lab in labs:
        assert lab.spec.rubric, f"{lab.path}/lab.yaml ships no rubric"
        for item in lab.spec.rubric:
            assert item.criterion in criteria and item.section in lab.spec.report.prose, (lab.path, item.id)
    staged = [len(course.lab(w, track="nvidia").spec.rubric) for w in ("week22", "week23", "week24")]
    assert staged[0] < staged[1] < staged[2]  # a project's item is scored from its own week on
    spec = yaml.safe_load((Path(labs[0].path) / "lab.yaml").read_text())
    first = spec["rubric"][0]
    for bad, message in ((({"week": "week23"}), "only a track project's items"),({"section": "Nowhere"}, "names section 'Nowhere'"),
                         ({"levels": {1: "one", 2: "two"}}, "the lowest worth 0 points"),
                         ({"levels": {0: "only"}}, "2 to 10 levels")):
        spec["rubric"] = [{**first, **bad}]
        (tmp_path / "lab.yaml").write_text(yaml.safe_dump(spec))
        with pytest.raises(CourseFileError, match=message):
            load_lab(tmp_path / "lab.yaml")


def test_dev_check_refuses_a_rubric_naming_an_unknown_criterion(tmp_path):
    from infracourse.dev import static_problems

    course = _course(tmp_path / "course")
    assert not [p for p in static_problems(course, course.lab("week01")) if "rubric" in p]
    path = course.root / "labs" / "week01-answer" / "lab.yaml"
    path.write_text(path.read_text().replace("criterion: explain-trade-offs", "criterion: telepathy"))
    problems = static_problems(Course(course.root), Course(course.root).lab("week01"))
    assert any("rubric item 'conclusion' names criterion 'telepathy'" in p for p in problems), problems


def test_the_app_needs_its_token_and_answers_on_localhost_only(cohort):
    book, course = cohort
    review = Review(book, course)
    with served(review) as (sock, base):
        stranger = Browser(base)
        assert stranger.get("/")[0] == 401
        assert stranger.get("/login?token=wrong&reviewer=ada")[0] == 403
        assert stranger.score(_week01(book)[0], "conclusion", 2)[0] == 401
        ada = _login(sock, review, "ada")
        connection = http.client.HTTPConnection("127.0.0.1", sock.getsockname()[1], timeout=10)
        jar = next(h.cookiejar for h in ada.opener.handlers if isinstance(h, urllib.request.HTTPCookieProcessor))
        cookie = next(iter(jar))
        connection.request("GET", "/", headers={"Host": "attacker.example", "Cookie": f"{cookie.name}={cookie.value}"})
        reply = connection.getresponse()
        assert reply.status == 403 and b"only on localhost" in reply.read()  # DNS rebinding: a foreign Host
        for origin in ("https://evil.example", f"http://127.0.0.1:{sock.getsockname()[1] + 1}"):  # another app
            connection.request("PUT", f"/api/submissions/{_week01(book)[0]}/scores/conclusion",
                               body=json.dumps({"points": 2, "base": None}),
                               headers={"Cookie": f"{cookie.name}={cookie.value}", "Origin": origin,
                                        "Content-Type": "application/json"})
            reply = connection.getresponse()
            assert reply.status == 403 and b"another site" in reply.read(), origin
        assert ada.put(f"/api/submissions/{_week01(book)[0]}/scores/conclusion", {"points": 2},
                       content_type="text/plain")[0] == 415  # what a cross-site form could send
        assert not book.scores()
        assert sock.getsockname()[0] == "127.0.0.1"


def test_learner_html_renders_as_text_under_a_strict_policy(cohort):
    book, course = cohort
    review = Review(book, course)
    with served(review) as (sock, base):
        ada = _login(sock, review, "ada")
        hostile = next(s.id for s in book.latest_submissions(week="week01", learner="learner0"))
        status, page = ada.get(f"/submissions/{hostile}/")
        assert status == 200
        assert "<script>document" not in page and "&lt;script&gt;document.title" in page
        assert "<img src=x" not in page and 'href="javascript' not in page
        assert "learner0" not in page  # anonymous by default: a pseudonym
        reply = ada.opener.open(f"{base}/submissions/{hostile}/")
        assert "script-src 'self'" in reply.headers["Content-Security-Policy"]
        status, raw = ada.get(f"/submissions/{hostile}/report.md")
        assert status == 200
        reply = ada.opener.open(f"{base}/submissions/{hostile}/report.md")
        assert reply.headers["Content-Type"].startswith("text/plain")  # a learner file never runs as a page
        assert ada.opener.open(f"{base}/submissions/{hostile}/plot.png").headers["Content-Type"] == "image/png"


def test_scores_are_kept_per_reviewer_with_history_and_conflicts(cohort):
    book, course = cohort
    review = Review(book, course)
    first, second, _ = _week01(book)
    with served(review) as (sock, base):
        ada, bob = _login(sock, review, "ada"), _login(sock, review, "bob")
        status, saved = ada.score(first, "conclusion", 2, "clear")
        assert status == 200
        assert bob.score(first, "conclusion", 1, "thin")[0] == 200  # another reviewer: their own row
        assert bob.score(second, "limits", 3)[0] == 200
        # ada's second tab still thinks there is no score: refused, nothing overwritten
        status, conflict = ada.score(first, "conclusion", 0)
        assert status == 409 and conflict["current"]["points"] == 2
        status, changed = ada.score(first, "conclusion", 1, "on reflection", base=saved["score"]["id"])
        assert status == 200
        page = ada.get(f"/submissions/{first}/")[1]
        assert "1 earlier score(s)" in page and "on reflection" in page and "thin" not in page
    trail = [(s.reviewer, s.item, s.points, s.replaces) for s in book.scores(first)]
    assert trail == [("ada", "conclusion", 2, None), ("bob", "conclusion", 1, None),
                     ("ada", "conclusion", 1, saved["score"]["id"])]
    current = rubric.by_reviewer(book.scores(first))
    assert {r: {i: s.points for i, s in x.current.items()} for r, x in current.items()} == \
        {"ada": {"conclusion": 1}, "bob": {"conclusion": 1}}


def test_bad_scores_and_a_busy_gradebook_are_clear_errors_that_lose_nothing(cohort):
    book, course = cohort
    review = Review(book, course, busy_s=0.2)
    first = _week01(book)[0]
    week02 = book.latest_submissions(week="week02")[0].id
    with served(review) as (sock, base):
        ada = _login(sock, review, "ada")
        assert ada.score(first, "conclusion", 2)[0] == 200
        for item, points, message in (("conclusion", 7, "not one of its levels [0, 1, 2]"),
                                      ("conclusion", "2", "not one of its levels"),
                                      ("vibes", 1, "no rubric item 'vibes'")):
            status, reply = ada.score(first, item, points, base=book.scores(first)[-1].id)
            assert status == 422 and message in reply["error"], reply
        status, reply = ada.score(9999, "conclusion", 1)
        assert status == 404 and "not in the gradebook" in reply["error"]
        assert ada.get(f"/submissions/{week02}/")[0] == 404  # a week without a rubric is not reviewed
        with closing(sqlite3.connect(book.path)) as other:  # an import or a regrade writing
            other.execute("BEGIN IMMEDIATE")
            status, reply = ada.score(first, "limits", 1)
            other.execute("ROLLBACK")
        assert status == 503 and "the score was not saved" in reply["error"]
        assert ada.score(first, "limits", 1)[0] == 200  # sent again once the writer is done
    assert [(s.item, s.points) for s in book.scores(first)] == [("conclusion", 2), ("limits", 1)]


def test_status_export_and_lms_carry_the_review_points(cohort, tmp_path):
    book, course = cohort
    first, second, third = _week01(book)
    for reviewer, sid, points in (("ada", first, (2, 3)), ("bob", first, (1, 1)), ("ada", second, (0, None))):
        for item, p in zip(("conclusion", "limits"), points):
            if p is not None:
                book.record_score(sid, reviewer, item, p, "", base=None)
    [week01] = rubric.status(book, course)
    assert (week01.week, week01.submissions, week01.unreviewed, week01.finished) == ("week01", 3, 2, {"ada": 1, "bob": 1})
    rows = {(r["learner"], r["week"]): r for r in csv.DictReader(export.export(book, course, tmp_path / "g.csv").open())}
    by_id = {s.id: s.learner for s in book.latest_submissions()}
    assert rows[by_id[first], "week01"]["review_points"] == "3.5"  # the mean of ada's 5 and bob's 2
    assert rows[by_id[first], "week01"]["review_max"] == "5" and rows[by_id[first], "week01"]["reviewers"] == "2"
    assert rows[by_id[second], "week01"]["review_points"] == ""  # ada has not finished it
    assert rows[by_id[first], "week02"]["review_max"] == ""  # no rubric
    document = json.loads(export.export(book, course, tmp_path / "g.json").read_text())
    [row] = [r for r in document["rows"] if r["learner"] == by_id[first] and r["week"] == "week01"]
    assert {s["reviewer"]: s["points"] for s in row["review"]} == {"ada": 5, "bob": 2}
    table = list(csv.reader(export.export(book, course, tmp_path / "canvas.csv", format="canvas").open()))
    column = table[0].index("infracourse week01 review: Answer 1")
    assert table[1][column] == "5"  # Points Possible: the rubric's maximum
    assert [r[column] for r in table[2:] if r[0] == by_id[first]] == ["3.5"]


def test_cli_status_prints_what_remains_and_review_serves_what_it_was_asked(cohort, monkeypatch):
    from typer.testing import CliRunner

    from infracourse.cli import app
    from infracourse.cohort import review

    book, course = cohort
    monkeypatch.setenv("INFRACOURSE_COURSE", str(course.root))
    book.record_score(_week01(book)[0], "ada", "conclusion", 2, "", base=None)
    book.record_score(_week01(book)[0], "ada", "limits", 0, "", base=None)
    result = CliRunner().invoke(app, ["cohort", "review", "--status", "-g", str(book.path)], catch_exceptions=False)
    assert result.exit_code == 0 and "week01" in result.output and "ada 1" in result.output, result.output
    served_with = {}
    monkeypatch.setattr(review, "serve", lambda app_, **kw: served_with.update(app=app_, **kw))
    result = CliRunner().invoke(app, ["cohort", "review", "--week", "1", "--reviewer", "bob", "--port", "8765",
                                      "-g", str(book.path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (served_with["app"].week, served_with["app"].anonymous, served_with["port"], served_with["reviewer"]) == \
        ("week01", True, 8765, "bob")


def test_published_feedback_shows_each_learner_only_their_finished_reviews(cohort, tmp_path):
    from infracourse.cohort.publish import publish

    book, course = cohort
    first, second, _ = _week01(book)
    learner = {s.id: s.learner for s in book.latest_submissions()}
    book.record_score(first, "ada", "conclusion", 2, "<script>alert(1)</script> well argued", base=None)
    book.record_score(first, "ada", "limits", 1, "", base=None)
    book.record_score(second, "bob", "conclusion", 1, "unfinished review", base=None)
    plain = publish(book, course, tmp_path / "plain")
    assert "well argued" not in (plain / "learners" / f"{learner[first]}.html").read_text()
    site = publish(book, course, tmp_path / "site", feedback=True)
    page = (site / "learners" / f"{learner[first]}.html").read_text()
    assert "Review: 3/5 points" in page and "&lt;script&gt;alert(1)&lt;/script&gt; well argued" in page
    assert "argued from the figures" in page  # the level's description
    others = "".join(p.read_text() for p in (site / "learners").glob("*.html") if p.stem != learner[first])
    assert "well argued" not in others and "unfinished review" not in others


def test_a_learner_reads_their_published_feedback_with_their_secret(cohort, tmp_path):
    from typer.testing import CliRunner

    from infracourse.cli import app
    from infracourse.cohort.publish import publish
    from infracourse.cohort.roster import Learner

    book, course = cohort
    first, second, _ = _week01(book)
    learner = {s.id: s.learner for s in book.latest_submissions()}
    book.import_roster([Learner(learner[first], "Ada", "ada@uni.example"), Learner(learner[second], "Bo", "b@x")])
    keys = {who.id: key for who, key in book.roster()}
    book.record_score(first, "ada", "conclusion", 2, "[red]well[/red] argued", base=None)
    book.record_score(first, "ada", "limits", 1, "", base=None)
    site = publish(book, course, tmp_path / "site", feedback=True)
    assert len(list((site / "feedback").iterdir())) == 1  # only a finished review is handed out
    assert not any(learner[first] in p.name for p in (site / "feedback").iterdir())
    for who in (first, second):
        (tmp_path / f"{who}.secret").write_text(f"infracourse-secret:1:{learner[who]}:{keys[learner[who]]}\n")
    read = lambda who, *more: CliRunner().invoke(app, ["feedback", "week01", "--site", str(site), "--secret-file",
                                                      str(tmp_path / f"{who}.secret"), *more], catch_exceptions=False)
    result = read(first)
    assert result.exit_code == 0 and "3/5 points" in result.output and "[red]well[/red] argued" in result.output, \
        result.output
    result = read(second)
    assert result.exit_code == 2 and "no feedback for you" in result.output
    [path] = (site / "feedback").iterdir()
    path.write_text(path.read_text().replace('"points": 2', '"points": 99'))  # changed after publishing
    result = read(first)
    assert result.exit_code == 2 and "not feedback signed for your secret" in result.output


def test_a_score_of_an_item_the_rubric_dropped_is_kept_as_stale_and_never_counted(cohort):
    book, course = cohort
    first = _week01(book)[0]
    book.record_score(first, "ada", "conclusion", 2, "", base=None)
    book.record_score(first, "ada", "limits", 3, "", base=None)
    [conclusion, _] = course.lab("week01").spec.rubric
    ada = rubric.by_reviewer(book.scores(first))["ada"]
    assert [s.item for s in ada.stale([conclusion])] == ["limits"]
    assert ada.finished([conclusion]) and rubric.review_points({'ada': ada}, [conclusion]) == 2
    with pytest.raises(rubric.RubricError, match="no rubric item 'limits'"):
        rubric.checked_score([conclusion], "limits", 1, "")


def test_a_save_waiting_on_a_busy_gradebook_does_not_hold_up_the_other_reviewers(cohort):
    book, course = cohort
    review = Review(book, course, busy_s=3)
    first = _week01(book)[0]
    with served(review) as (sock, base):
        ada, bob = _login(sock, review, "ada"), _login(sock, review, "bob")
        replies = []
        with closing(sqlite3.connect(book.path)) as other:  # an import or a regrade writing
            other.execute("BEGIN IMMEDIATE")
            waiting = threading.Thread(target=lambda: replies.append(ada.score(first, "conclusion", 2)))
            waiting.start()
            time.sleep(0.5)
            started = time.monotonic()
            assert bob.get(f"/submissions/{first}/")[0] == 200
            assert time.monotonic() - started < 2, "bob's page waited for ada's save"
            waiting.join(10)
            other.execute("ROLLBACK")
        assert replies[0][0] == 503
