"""What the review app shows of one submission: the report rendered, the machine-graded results and figures,
and the learner's files as a diff from the starter.

Everything here comes from the learner's bundle and is untrusted: the report is rendered by markdown-it with
raw HTML off (a `<script>` in it is text) and its link validation on (no `javascript:` URLs); every other
string reaches the page only through Jinja's autoescape. The app's Content-Security-Policy (cohort.review)
is the second wall: no inline script runs and no image loads from elsewhere, whatever got through.
"""
from __future__ import annotations

import difflib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

from infracourse.cohort.bundle import Bundle, lab_of, parse_bundle
from infracourse.cohort.gradebook import Gradebook, Submission
from infracourse.course import Course
from infracourse.grading.plots import write_kernel_plots
from infracourse.grading.results import GradeResult

MAX_DIFF_LINES = 3000  # per file: a generated data file should not drown the page
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif"}
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


@dataclass
class FileDiff:
    name: str
    state: str  # "changed", "unchanged", "added" (not in the starter), "binary"
    lines: list[str] = field(default_factory=list)  # unified diff lines, starting with ' ', '+', '-' or '@'
    truncated: bool = False


@dataclass
class SubmissionView:
    submission: Submission
    report_html: str  # already safe: markdown-it with raw HTML off
    report_file: str | None
    result: GradeResult
    verified: bool  # `result` is the instructor's regrade (else the learner's own grade)
    figures: list[tuple[str, str, object]]  # (check id, figure name, Figure)
    diffs: list[FileDiff]
    plots: list[str]  # file names of the grade's plots (served beside the page)


def render_markdown(text: str) -> str:
    return _MARKDOWN.render(text)


def load(gradebook: Gradebook, course: Course, submission: Submission) -> tuple[Bundle, SubmissionView]:
    """The bundle as stored, and what the page shows of it."""
    bundle = parse_bundle(gradebook.bundle_data(submission.id), course, source=f"submission {submission.id}")
    lab = lab_of(course, submission.week, submission.track)
    report = lab.spec.report.file if lab.spec.report else None
    text = bundle.files.get(report, b"").decode("utf-8", "replace") if report else ""
    verified = gradebook.results_of(submission.id, "verified")
    result = verified[-1][1] if verified else bundle.results
    figures = [(c.id, name, f) for c in result.checks for name, f in c.figures.items()]
    diffs = [diff(name, bundle.files[name], _starter(lab.starter / name))
             for name in sorted(bundle.files) if name != report]
    view = SubmissionView(submission, render_markdown(text) if text else "", report, result, bool(verified),
                          figures, diffs, [])
    return bundle, view


def diff(name: str, learner: bytes, starter: bytes | None) -> FileDiff:
    """The learner's file against the starter's (a file the starter lacks is shown whole, as added)."""
    try:
        mine = learner.decode("utf-8").splitlines()
        theirs = starter.decode("utf-8").splitlines() if starter is not None else []
    except UnicodeDecodeError:
        return FileDiff(name, "binary", [f"{len(learner)} bytes"])
    if starter is not None and mine == theirs:
        return FileDiff(name, "unchanged")
    lines = list(difflib.unified_diff(theirs, mine, "starter/" + name, name, lineterm="", n=3))[2:]
    return FileDiff(name, "changed" if starter is not None else "added", lines[:MAX_DIFF_LINES],
                    len(lines) > MAX_DIFF_LINES)


def _starter(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


class Plots:
    """The grade's kernel plots (roofline, times per shape), drawn once per submission into a private folder."""

    def __init__(self):
        self._dir = tempfile.TemporaryDirectory(prefix="infracourse-review-")
        self._drawn: dict[int, list[str]] = {}

    def of(self, view: SubmissionView, ceilings: dict | None) -> list[str]:
        sid = view.submission.id
        if sid not in self._drawn:
            written = write_kernel_plots(view.result, ceilings, Path(self._dir.name) / str(sid))
            self._drawn[sid] = [p.name for p in written]
        return self._drawn[sid]

    def path(self, submission_id: int, name: str) -> Path | None:
        if name not in self._drawn.get(submission_id, []):
            return None
        return Path(self._dir.name) / str(submission_id) / name

    def close(self) -> None:
        self._dir.cleanup()
