"""`infracourse cohort review`: a local web app where instructors score, by the week's rubric, what no
machine can grade — the reasoning of each submission's report (after nbgrader's formgrader).

The app binds 127.0.0.1 only and admits a browser that opened the URL it printed at start, which carries a
random token (and the reviewer's name): the token is swapped for an HttpOnly, SameSite=Strict session
cookie, and every other request needs that cookie. A request whose Host is not localhost is refused (a
page elsewhere cannot reach the app by DNS rebinding), and so is a write from another origin or without a
JSON body. Learner text is rendered as text (cohort.review_page) under a Content-Security-Policy that runs
only the app's own script file.

Scores go to the gradebook one transaction each, per reviewer (Gradebook.record_score): two reviewers never
touch each other's rows, and a reviewer's second tab cannot overwrite a score it has not seen (409). A score
the rubric does not take is refused (422) and one the gradebook cannot take now, because an import or a
regrade holds it, is refused (503) and stays in the form, marked unsaved.
"""
from __future__ import annotations

import hmac
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlencode

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from infracourse import safe_text
from infracourse.cohort import review_page, rubric
from infracourse.cohort.gradebook import Gradebook, GradebookError, Score, ScoreConflict, Submission
from infracourse.cohort.publish import TEMPLATES, learner_names
from infracourse.course import Course
from infracourse.syllabus import RubricItem

SESSION_COOKIE = "infracourse_review"
REVIEWER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
LOCAL_HOSTS = ("127.0.0.1", "localhost")
HEADERS = {  # the second wall behind escaping: nothing runs or loads but the app's own files
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
ASSETS = {"review.js": "text/javascript", "review.css": "text/css"}


@dataclass(frozen=True)
class Entry:
    """A submission in the queue: the newest of a learner x week whose lab has a rubric."""
    submission: Submission
    name: str  # what reviewers see: a pseudonym unless the app runs with anonymous=False
    rubric: list[RubricItem]


class Review:
    """The app's state: the gradebook, the course, the token and who holds which session."""

    def __init__(self, gradebook: Gradebook, course: Course, *, token: str | None = None, week: str | None = None,
                 anonymous: bool = True, busy_s: float = 5):
        self.gradebook, self.course, self.week, self.anonymous, self.busy_s = gradebook, course, week, anonymous, busy_s
        self.token = token or secrets.token_urlsafe(24)
        self.sessions: dict[str, str] = {}  # session cookie -> reviewer
        self.plots = review_page.Plots()

    def queue(self) -> list[Entry]:
        submissions = self.gradebook.latest_submissions(week=self.week)
        key = self.gradebook.meta("pseudonym_key") if self.anonymous else None
        names, rubric_of = learner_names(sorted({s.learner for s in submissions}), key), rubric.Rubrics(self.course)
        entries = [Entry(s, names[s.learner], r) for s in submissions if (r := rubric_of(s))]
        return sorted(entries, key=lambda e: (e.submission.week, e.name))  # pseudonyms: an order that reveals no id

    def entry(self, submission_id: int) -> Entry | None:
        """The queue's entry of that submission (None: not in the gradebook, not the newest, or no rubric)."""
        found = self.gradebook.submission(submission_id)
        if found is None or found.week != (self.week or found.week):
            return None
        newest = self.gradebook.latest_submissions(week=found.week, learner=found.learner)
        items = rubric.rubric_of(self.course, found)
        if not items or [s.id for s in newest] != [submission_id]:
            return None
        key = self.gradebook.meta("pseudonym_key") if self.anonymous else None
        return Entry(newest[0], learner_names([found.learner], key)[found.learner], items)

    def login(self, token: str, reviewer: str) -> str | None:
        """A new session for `reviewer` if `token` is the app's; None otherwise."""
        if not (hmac.compare_digest(token.encode(), self.token.encode()) and REVIEWER.match(reviewer)):
            return None
        session = secrets.token_urlsafe(24)
        self.sessions[session] = reviewer
        return session


def create_app(review: Review) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             finalize=safe_text.finalize)  # learner text: control characters out
    env.globals["title"] = review.course.syllabus.title

    def page(template: str, status: int = 200, **context) -> HTMLResponse:
        return HTMLResponse(env.get_template(template).render(**context), status_code=status)

    def refusal(status: int, message: str, request: Request) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=status)
        return page("review_error.html.j2", status, message=message)

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable) -> Response:
        host = request.headers.get("host", "").rpartition(":")[0] or request.headers.get("host", "")
        origin = request.headers.get("origin")
        if host not in LOCAL_HOSTS:
            response = refusal(403, f"this app answers only on localhost, not {host!r}", request)
        elif request.method not in ("GET", "HEAD") and origin is not None and \
                origin != f"http://{request.headers.get('host')}":  # another port of localhost is another app
            response = refusal(403, "a write from another site is refused", request)
        elif request.url.path not in ("/login", *(f"/static/{a}" for a in ASSETS)) \
                and review.sessions.get(request.cookies.get(SESSION_COOKIE, "")) is None:
            response = refusal(401, "open the URL that `infracourse cohort review` printed (it carries the token)",
                               request)
        else:
            request.state.reviewer = review.sessions.get(request.cookies.get(SESSION_COOKIE, ""))
            response = await call_next(request)
        response.headers.update(HEADERS)
        return response

    @app.get("/login")
    def login(request: Request, token: str = "", reviewer: str = "") -> Response:
        session = review.login(token, reviewer)
        if session is None:
            return refusal(403, "wrong token, or a reviewer name that is not letters, digits and ._@- (at most 64): "
                           "open the URL `infracourse cohort review` printed", request)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict")
        return response

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)  # none: a browser's request for it is not an error

    @app.get("/static/{asset}")
    def static(asset: str) -> Response:
        if asset not in ASSETS:
            return JSONResponse({"error": "no such file"}, status_code=404)
        return FileResponse(TEMPLATES / asset, media_type=ASSETS[asset])

    @app.get("/")
    def queue(request: Request) -> Response:
        reviewer, entries = request.state.reviewer, review.queue()
        scores = rubric.scores_by_submission(review.gradebook)
        rows = [_row(e, rubric.by_reviewer(scores.get(e.submission.id, [])), reviewer, review.gradebook)
                for e in entries]
        return page("review_queue.html.j2", rows=rows, reviewer=reviewer, week=review.week,
                    anonymous=review.anonymous)

    @app.get("/submissions/{submission_id}/")
    def submission(request: Request, submission_id: int) -> Response:
        reviewer, entries = request.state.reviewer, review.queue()
        at = next((i for i, e in enumerate(entries) if e.submission.id == submission_id), None)
        if at is None:
            return refusal(404, _not_reviewable(review, submission_id), request)
        entry = entries[at]
        bundle, view = review_page.load(review.gradebook, review.course, entry.submission)
        view.plots = review.plots.of(view, None if view.verified else bundle.manifest.ceilings)
        reviewers = rubric.by_reviewer(review.gradebook.scores(submission_id))
        mine = reviewers.get(reviewer) or rubric.ReviewerScores(reviewer)
        others = sum(r.finished(entry.rubric) for name, r in reviewers.items() if name != reviewer)
        return page("review_submission.html.j2", entry=entry, view=view, mine=mine, others=others,
                    stale=mine.stale(entry.rubric), reviewer=reviewer, max_points=rubric.max_points(entry.rubric),
                    previous=entries[at - 1].submission.id if at > 0 else None,
                    next=entries[at + 1].submission.id if at + 1 < len(entries) else None,
                    position=at + 1, count=len(entries),
                    week=review.course.week(entry.submission.week))

    @app.get("/submissions/{submission_id}/{name:path}")
    def submission_file(request: Request, submission_id: int, name: str) -> Response:
        """A file the report links to (a plot of theirs), or one of the grade's plots; anything but an image is
        sent as plain text, so no learner file runs as a page."""
        entry = review.entry(submission_id)
        if entry is None:
            return refusal(404, _not_reviewable(review, submission_id), request)
        if name.startswith("plots/") and (path := review.plots.path(submission_id, name[6:])) is not None:
            return FileResponse(path, media_type="image/png")
        bundle, _ = review_page.load(review.gradebook, review.course, entry.submission)
        if name not in bundle.files:
            return refusal(404, f"the submission has no file {name!r}", request)
        media = review_page.IMAGE_TYPES.get(Path(name).suffix.lower(), "text/plain; charset=utf-8")
        return Response(bundle.files[name], media_type=media)

    @app.put("/api/submissions/{submission_id}/scores/{item}")
    async def score(request: Request, submission_id: int, item: str) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return refusal(415, "send the score as JSON: {points, comment, base}", request)
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not (body.get("base") is None or type(body.get("base")) is int):
            return refusal(422, "send the score as a JSON object {points, comment, base}", request)
        entry = await run_in_threadpool(review.entry, submission_id)
        if entry is None:
            return refusal(404, _not_reviewable(review, submission_id), request)
        try:
            points, comment = rubric.checked_score(entry.rubric, item, body.get("points"), body.get("comment", ""))
            # in a worker thread: a gradebook held by an import may keep this waiting busy_s, and the other
            # reviewers' requests must not wait with it
            saved = await run_in_threadpool(review.gradebook.record_score, submission_id, request.state.reviewer, item,
                                            points, comment, base=body.get("base"), busy_s=review.busy_s)
        except rubric.RubricError as exc:
            return refusal(422, str(exc), request)
        except ScoreConflict as exc:
            return JSONResponse({"error": str(exc), "current": _score_json(exc.current)}, status_code=409)
        except GradebookError as exc:
            return refusal(503, str(exc), request)
        return JSONResponse({"score": _score_json(saved)})

    return app


def serve(review: Review, *, port: int = 0, on_ready: Callable[[str], None] = print,
          reviewer: str = "instructor") -> None:
    """Serve the app on 127.0.0.1 until interrupted; `on_ready` gets the URL to open (it holds the token)."""
    server, sock = bound_server(review, port)
    on_ready(login_url(sock, review, reviewer))
    try:
        server.run(sockets=[sock])
    finally:
        review.plots.close()


def bound_server(review: Review, port: int = 0):
    """(uvicorn server, its socket bound to 127.0.0.1:port): never another interface, since learner files
    are on these pages; port 0 takes a free one."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return uvicorn.Server(uvicorn.Config(create_app(review), log_level="warning", lifespan="off")), sock


def login_url(sock: socket.socket, review: Review, reviewer: str) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}/login?" + urlencode({"token": review.token, "reviewer": reviewer})


def _row(entry: Entry, reviewers: dict[str, rubric.ReviewerScores], me: str, gradebook: Gradebook) -> dict:
    mine = reviewers.get(me) or rubric.ReviewerScores(me)
    verified = gradebook.results_of(entry.submission.id, "verified")
    graded = verified or gradebook.results_of(entry.submission.id, "self")
    return {"entry": entry, "scored": sum(i.id in mine.current for i in entry.rubric), "items": len(entry.rubric),
            "total": mine.total(entry.rubric), "max": rubric.max_points(entry.rubric),
            "others": sum(r.finished(entry.rubric) for n, r in reviewers.items() if n != me),
            "graded": _graded(graded[-1][1]) + (" (your regrade)" if verified else " (self-reported)")}


def _graded(result) -> str:
    return f"{result.count('passed')}/{len(result.checks)} passed"


def _not_reviewable(review: Review, submission_id: int) -> str:
    if review.gradebook.submission(submission_id) is None:
        return f"submission {submission_id} is not in the gradebook {review.gradebook.path}"
    return (f"submission {submission_id} is not in this review's queue: an older submission, a week outside "
            f"--week {review.week}, or a week without a rubric" if review.week else
            f"submission {submission_id} is not in the queue: an older submission, or a week without a rubric")


def _score_json(score: Score | None) -> dict | None:
    return None if score is None else {"id": score.id, "item": score.item, "points": score.points,
                                       "comment": score.comment, "scored_at": score.scored_at}
