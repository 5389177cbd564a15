"""`cohort review` in a real headless Chromium: two reviewers score different submissions at once with the
keyboard only, a reload shows the scores kept, the hostile report runs nothing (no console error, no CSP
violation, the learner's script is text), and the export carries the points."""
from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

from infracourse.cohort import export

sys.path.insert(0, str(Path(__file__).parent))
from cohort_support import Chromium, _is_error  # noqa: E402
from test_cohort_review import Review, _login, _week01, cohort, login_url, served  # noqa: E402,F401

KEYS = {"Enter": ("Enter", 13, "\r"), "ArrowDown": ("ArrowDown", 40, ""), "Escape": ("Escape", 27, ""),
        **{d: (f"Digit{d}", 48 + int(d), d) for d in "0123456789"}, "n": ("KeyN", 78, "n"), "c": ("KeyC", 67, "c")}


def _evaluate(browser: Chromium, js: str):
    reply = browser.call("Runtime.evaluate", session=True, expression=js, returnByValue=True)
    assert "exceptionDetails" not in reply, reply
    return reply["result"].get("value")


def _until(browser: Chromium, js: str, timeout: float = 15, explain: str = "location.href"):
    deadline = time.monotonic() + timeout
    while not (value := _evaluate(browser, js)):
        assert time.monotonic() < deadline, f"never true: {js} ({_evaluate(browser, explain)})"
        time.sleep(0.05)
    return value


def _open(browser: Chromium, url: str) -> None:
    browser.events.clear()
    browser.call("Page.navigate", session=True, url=url)
    browser.wait_for("Page.loadEventFired")
    _until(browser, "document.readyState === 'complete'")


def _press(browser: Chromium, key: str, *, loads: bool = False) -> None:
    """Type one key; with `loads`, wait for the page it opens and for its script to have set it up."""
    code, number, text = KEYS[key]
    if loads:
        browser.events.clear()
        before = _evaluate(browser, "location.href")
    down = {"type": "keyDown" if text else "rawKeyDown", "key": key, "code": code, "windowsVirtualKeyCode": number}
    browser.call("Input.dispatchKeyEvent", session=True, **down, **({"text": text} if text else {}))
    browser.call("Input.dispatchKeyEvent", session=True, type="keyUp", key=key, code=code, windowsVirtualKeyCode=number)
    if loads:
        browser.wait_for("Page.loadEventFired")
        _until(browser, f"location.href !== {json.dumps(before)} && document.readyState === 'complete' && "
                        "document.querySelector('.selected, .focused') !== null")


SAVED = "[...document.querySelectorAll('fieldset.item .state')].every(s => s.textContent.startsWith('saved'))"
STATES = "JSON.stringify([...document.querySelectorAll('fieldset.item .state')].map(s => s.textContent))"
CHOSEN = "JSON.stringify([...document.querySelectorAll('fieldset.item')].map(f => " \
         "[f.dataset.item, (f.querySelector('input:checked') || {}).value, f.querySelector('textarea').value]))"


def test_two_reviewers_score_with_the_keyboard_and_the_scores_stay(cohort, tmp_path):
    book, course = cohort
    review = Review(book, course)
    first, second, third = _week01(book)
    ada, bob = Chromium(tmp_path / "ada"), Chromium(tmp_path / "bob")
    try:
        with served(review) as (sock, base):
            for browser, name in ((ada, "ada"), (bob, "bob")):
                _open(browser, login_url(sock, review, name))
                assert _evaluate(browser, "document.querySelector('h1').textContent").startswith("Review queue")
            _press(ada, "Enter", loads=True)  # the first submission in the queue (pseudonym order)
            _press(bob, "Enter", loads=True)
            _press(bob, "n", loads=True)  # bob takes the next one
            ada_sid = int(_evaluate(ada, "document.getElementById('rubric').dataset.submission"))
            bob_sid = int(_evaluate(bob, "document.getElementById('rubric').dataset.submission"))
            assert ada_sid != bob_sid and {ada_sid, bob_sid} <= {first, second, third}
            for browser, (level, down_level) in ((ada, ("2", "3")), (bob, ("1", "0"))):  # interleaved
                _press(browser, level)
            for browser, (level, down_level) in ((ada, ("2", "3")), (bob, ("1", "0"))):
                _press(browser, "ArrowDown")
                _press(browser, down_level)
            _press(ada, "c")
            ada.call("Input.insertText", session=True, text="names the bound <b>clearly</b>")
            _press(ada, "Escape")  # leaves the comment: saved with the item's level
            _until(ada, SAVED + " && !document.querySelector('.unsaved')", explain=STATES)
            _until(bob, SAVED + " && !document.querySelector('.unsaved')", explain=STATES)
            assert _evaluate(ada, "document.getElementById('total').textContent") == "5/5"
            ada.call("Page.reload", session=True)
            ada.wait_for("Page.loadEventFired")
            assert json.loads(_evaluate(ada, CHOSEN)) == [["conclusion", "2", ""],
                                                          ["limits", "3", "names the bound <b>clearly</b>"]]
            bob.call("Page.reload", session=True)
            bob.wait_for("Page.loadEventFired")
            assert json.loads(_evaluate(bob, CHOSEN)) == [["conclusion", "1", ""], ["limits", "0", ""]]
            hostile = next(s.id for s in book.latest_submissions(week="week01", learner="learner0"))
            ada.events.clear()
            _open(ada, f"{base}/submissions/{hostile}/")
            assert _evaluate(ada, "document.title") != "pwned"
            assert _evaluate(ada, "document.scripts.length") == 1  # the app's own review.js only
            assert "<script>" in _evaluate(ada, "document.querySelector('.markdown').textContent")
            assert not [e for e in ada.events if _is_error(e)], ada.events
    finally:
        ada.close()
        bob.close()
    mine = {(s.reviewer, s.submission_id, s.item): (s.points, s.comment) for s in book.scores()}
    assert mine == {("ada", ada_sid, "conclusion"): (2, ""), ("ada", ada_sid, "limits"): (3, "names the bound <b>clearly</b>"),
                    ("bob", bob_sid, "conclusion"): (1, ""), ("bob", bob_sid, "limits"): (0, "")}
    rows = {r["learner"]: r for r in csv.DictReader(export.export(book, course, tmp_path / "g.csv").open())
            if r["week"] == "week01"}
    learner = {s.id: s.learner for s in book.latest_submissions()}
    assert rows[learner[ada_sid]]["review_points"] == "5.0" and rows[learner[bob_sid]]["review_points"] == "1.0"


def screenshot(out: Path) -> Path:
    """docs/img/review.png: week 9 of this course, the reference files handed in, two items scored."""
    import base64
    import tempfile
    from dataclasses import asdict

    from infracourse import __version__
    from infracourse.cohort import synthetic
    from infracourse.cohort.bundle import graders_digest, write_bundle
    from infracourse.cohort.gradebook import Gradebook
    from infracourse.course import Course

    with tempfile.TemporaryDirectory() as tmp:
        tmp, course = Path(tmp), Course()
        lab = course.lab("week09")
        hardware, ceilings = synthetic.DEVICES[0]
        result = synthetic.result_for(lab, hardware, ceilings, solved=True, share=0.8, started_at="2026-03-02T10:00:00")
        fields = dict(learner="ada", week="week09", created_at="2026-03-02T10:00:00Z", infracourse_version=__version__,
                      graders_sha256=graders_digest(lab), environment=hardware.as_dict(), ceilings=asdict(ceilings))
        files = {p.name: p.read_bytes() for p in lab.solution.iterdir()}
        book = Gradebook.create(tmp / "g.db", course)
        assert book.import_bundles([write_bundle(tmp / "a.zip", fields, files, result.as_dict())], course).committed
        [submission] = book.latest_submissions()
        book.record_score(submission.id, "ada", lab.spec.rubric[0].id, 2, "Both shapes placed by intensity.", base=None)
        review, browser = Review(book, course), Chromium(tmp / "profile")
        try:
            with served(review) as (sock, base):
                browser.call("Emulation.setDeviceMetricsOverride", session=True, width=1500, height=1000,
                             deviceScaleFactor=1, mobile=False)
                _open(browser, login_url(sock, review, "ada"))
                _press(browser, "Enter", loads=True)
                _press(browser, "ArrowDown")
                _press(browser, "1")
                _until(browser, "!document.querySelector('.unsaved')")
                shot = browser.call("Page.captureScreenshot", session=True, format="png")["data"]
        finally:
            browser.close()
    out.write_bytes(base64.b64decode(shot))
    return out


if __name__ == "__main__":
    print(screenshot(Path(__file__).resolve().parents[1] / "docs" / "img" / "review.png"))
