"""Rubric scores: what reviewers gave a submission by hand, read against the week's rubric in lab.yaml.

The gradebook keeps every score ever given (`Gradebook.scores`, append-only); this module reads them: a
reviewer's current score of an item is their newest row for it, a reviewer has *finished* a submission when
each rubric item has a current score, and a submission's review points are the mean of the finished
reviewers' totals (blank until one has finished), so two reviewers' scores are never merged item by item.
A score whose item the rubric no longer has (lab.yaml changed since) is kept, shown as stale and never
counted: nothing a reviewer gave is lost, and nothing counts against a rubric it was not given under.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterator

from infracourse.cohort.bundle import lab_of
from infracourse.cohort.gradebook import Gradebook, Score, Submission
from infracourse.course import Course
from infracourse.syllabus import CourseFileError, RubricItem


class RubricError(Exception):
    """A score the rubric cannot take; the message names the item, the allowed values and the fix."""


@dataclass
class ReviewerScores:
    """One reviewer's current scores of one submission, and the history behind them."""
    reviewer: str
    current: dict[str, Score] = field(default_factory=dict)  # item id -> newest score
    history: list[Score] = field(default_factory=list)  # every score they gave it, oldest first

    def finished(self, rubric: list[RubricItem]) -> bool:
        return bool(rubric) and all(item.id in self.current for item in rubric)

    def total(self, rubric: list[RubricItem]) -> int:
        return sum(self.current[item.id].points for item in rubric if item.id in self.current)

    def stale(self, rubric: list[RubricItem]) -> list[Score]:
        known = {item.id for item in rubric}
        return [s for item, s in sorted(self.current.items()) if item not in known]


def rubric_of(course: Course, submission: Submission) -> list[RubricItem]:
    """The rubric of the lab this submission was graded against (a project week: its track's project)."""
    try:
        return lab_of(course, submission.week, submission.track).spec.rubric
    except (CourseFileError, KeyError):
        return []  # a week this course no longer builds: nothing to score it against


class Rubrics:
    """rubric_of with each (week, track) read once: lab.yaml takes ~8 ms to load, so a queue of 500 would
    take seconds. Make one per request, so an edit of lab.yaml shows at the next page."""

    def __init__(self, course: Course):
        self.course, self._read = course, {}

    def __call__(self, submission: Submission) -> list[RubricItem]:
        key = (submission.week, submission.track)
        if key not in self._read:
            self._read[key] = rubric_of(self.course, submission)
        return self._read[key]


def max_points(rubric: list[RubricItem]) -> int:
    return sum(item.max_points for item in rubric)


def by_reviewer(scores: list[Score]) -> dict[str, ReviewerScores]:
    """Each reviewer's current scores and history, from one submission's rows (oldest first)."""
    reviewers: dict[str, ReviewerScores] = {}
    for score in scores:
        mine = reviewers.setdefault(score.reviewer, ReviewerScores(score.reviewer))
        mine.history.append(score)
        mine.current[score.item] = score
    return reviewers


def review_points(reviewers: dict[str, ReviewerScores], rubric: list[RubricItem]) -> float | None:
    """The mean total of the reviewers who scored every item (None: no one has finished)."""
    totals = [r.total(rubric) for r in reviewers.values() if r.finished(rubric)]
    return round(sum(totals) / len(totals), 2) if totals else None


def checked_score(rubric: list[RubricItem], item_id: str, points: object, comment: object) -> tuple[int, str]:
    """(points, comment) if the rubric's item takes them; RubricError naming the item and the fix otherwise."""
    item = next((i for i in rubric if i.id == item_id), None)
    if item is None:
        raise RubricError(f"no rubric item {item_id!r} in this week's lab.yaml (it has "
                          f"{', '.join(i.id for i in rubric) or 'no rubric'}): reload the page to get the current rubric")
    if isinstance(points, bool) or not isinstance(points, int) or points not in item.levels:
        raise RubricError(f"{item_id}: {points!r} is not one of its levels {sorted(item.levels)}; pick one of them")
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT:
        raise RubricError(f"{item_id}: the comment must be text of at most {MAX_COMMENT} characters")
    return points, comment


MAX_COMMENT = 10_000


@dataclass(frozen=True)
class Remaining:
    """`cohort review --status`: per week, submissions to review, and how many each reviewer has finished."""
    week: str
    submissions: int
    unreviewed: int  # no reviewer has finished them
    finished: dict[str, int]  # reviewer -> submissions they finished


def reviewed(gradebook: Gradebook, course: Course, *, week: str | None = None
             ) -> Iterator[tuple[Submission, list[RubricItem], dict[str, ReviewerScores]]]:
    """(submission, its rubric, its reviewers' scores) of the newest submission of each learner x week whose
    lab has a rubric: what --status, the export and the published feedback read."""
    scores = scores_by_submission(gradebook)
    rubric_of_ = Rubrics(course)
    for submission in gradebook.latest_submissions(week=week):
        if items := rubric_of_(submission):
            yield submission, items, by_reviewer(scores.get(submission.id, []))


def scores_by_submission(gradebook: Gradebook) -> dict[int, list[Score]]:
    scores: dict[int, list[Score]] = defaultdict(list)
    for score in gradebook.scores():
        scores[score.submission_id].append(score)
    return scores


def status(gradebook: Gradebook, course: Course, *, week: str | None = None) -> list[Remaining]:
    """What is left to review, per week with a rubric (newest submission of each learner x week)."""
    weeks: dict[str, list] = defaultdict(list)
    for submission, items, reviewers in reviewed(gradebook, course, week=week):
        weeks[submission.week].append([r.reviewer for r in reviewers.values() if r.finished(items)])
    remaining = []
    for week_id, finishers in sorted(weeks.items()):
        finished: dict[str, int] = defaultdict(int)
        for reviewer in (name for names in finishers for name in names):
            finished[reviewer] += 1
        remaining.append(Remaining(week_id, len(finishers), sum(not names for names in finishers), dict(finished)))
    return remaining


NO_REVIEW = {"review_points": None, "review_max": None, "reviewers": None, "review": []}


def review_columns(gradebook: Gradebook, course: Course) -> dict[tuple[str, str], dict]:
    """What `cohort export` adds per learner x week (their newest submission): `review_points` (the mean of the
    finished reviewers' totals), `review_max`, `reviewers` (how many finished) and, for JSON, `review`: each
    reviewer's current scores and comments. A week without a rubric is left out (NO_REVIEW)."""
    columns = {}
    for submission, items, reviewers in reviewed(gradebook, course):
        columns[submission.learner, submission.week] = {
            "review_points": review_points(reviewers, items), "review_max": max_points(items),
            "reviewers": sum(r.finished(items) for r in reviewers.values()),
            "review": [{"reviewer": r.reviewer, "finished": r.finished(items), "points": r.total(items),
                        "items": {i: {"points": s.points, "comment": s.comment, "scored_at": s.scored_at}
                                  for i, s in sorted(r.current.items())}} for r in reviewers.values()]}
    return columns


def feedback(gradebook: Gradebook, course: Course) -> dict[tuple[str, str], list[dict]]:
    """What `cohort publish --feedback` shows on a learner's own page, per learner x week (their newest
    submission): each finished reviewer's scores, in rubric order, with the level's description and the
    comment. Reviewers are numbered, not named; a reviewer still scoring is left out."""
    shown = {}
    for submission, items, reviewers in reviewed(gradebook, course):
        if finished := [r for r in reviewers.values() if r.finished(items)]:
            shown[submission.learner, submission.week] = [
                {"points": r.total(items), "max": max_points(items),
                 "items": [{"title": i.title, "points": r.current[i.id].points, "max": i.max_points,
                            "level": i.levels.get(r.current[i.id].points, ""), "comment": r.current[i.id].comment}
                           for i in items]} for r in finished]
    return shown
