"""Where each learner stands in each week: the one reading of the gradebook that export and publish share.

A learner x week is judged on its newest submission: the self-reported result it carried, and the newest
verified result of that submission (from `cohort regrade`), with the checks where the two disagree.
Performance is the best over all of that learner's results for the week, as a fraction of the ceiling of
the device that measured it (cohort.performance), so devices compare fairly; a figure with no ceiling to
judge it by is shown as last recorded.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from infracourse.cohort.bundle import graders_digest
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.performance import performance_checks, score
from infracourse.course import Course


@dataclass(frozen=True)
class WeekInfo:
    id: str
    title: str
    built: bool
    checks: int = 0
    performance: tuple[str, ...] = ()  # performance check ids: a kernel week has some
    graders_sha256: str = ""


@dataclass(frozen=True)
class Figure:
    check: str
    name: str
    value: float
    unit: str
    normalised: float | None
    origin: str  # "self" or "verified"


@dataclass
class Standing:
    learner: str
    week: str
    submissions: int = 0
    submitted_at: str = ""
    device: str = ""
    tier: str = ""
    total: int = 0
    self_passed: int = 0
    self_complete: bool = False
    self_verified_on_gpu: bool = False
    verified: bool = False
    verified_passed: int = 0
    verified_total: int = 0
    verified_complete: bool = False
    disagreements: list[dict] = field(default_factory=list)
    best: dict[str, Figure] = field(default_factory=dict)  # performance check id -> its best figure
    score: float | None = None
    graders_match: bool = True

    @property
    def state(self) -> str:
        """none | disagrees | verified | complete (self-reported only) | incomplete"""
        if not self.submissions:
            return "none"
        if self.disagreements:
            return "disagrees"
        if self.verified and self.verified_complete and self.self_complete:
            return "verified"
        return "complete" if self.self_complete else "incomplete"


@dataclass
class Cohort:
    title: str
    weeks: list[WeekInfo]
    learners: list[str]
    cells: dict[tuple[str, str], Standing]

    def cell(self, learner: str, week: str) -> Standing:
        return self.cells.get((learner, week)) or Standing(learner, week)

    def built_weeks(self) -> list[WeekInfo]:
        return [w for w in self.weeks if w.built]


def cohort_standing(gradebook: Gradebook, course: Course) -> Cohort:
    weeks = []
    for week in course.syllabus.weeks:
        if week.planned:
            weeks.append(WeekInfo(week.id, week.title, built=False))
            continue
        lab = course.lab(week)
        weeks.append(WeekInfo(week.id, week.title, True, len(lab.spec.checks), tuple(performance_checks(lab)),
                              graders_digest(lab)))
    info = {w.id: w for w in weeks}
    snap = gradebook.snapshot()
    results_of: dict[int, list[tuple]] = defaultdict(list)
    for row in snap["results"]:
        results_of[row[1]].append(row)
    figures_of: dict[int, list[tuple]] = defaultdict(list)
    for row in snap["figures"]:
        figures_of[row[0]].append(row)

    cells: dict[tuple[str, str], Standing] = {}
    newest: dict[tuple[str, str], tuple] = {}
    for row in snap["submissions"]:
        sub_id, learner, week, submitted_at, _ = row
        cell = cells.setdefault((learner, week), Standing(learner, week))
        cell.submissions += 1
        for result_id, _, origin, *_ in results_of[sub_id]:
            for _, check, name, value, unit, norm in figures_of[result_id]:
                _keep_best(cell.best, Figure(check, name, value, unit, norm, origin))
        seen = newest.get((learner, week))
        if seen is None or (submitted_at, sub_id) > (seen[3], seen[0]):
            newest[learner, week] = row
    for (learner, week), (sub_id, _, _, submitted_at, graders) in newest.items():
        cell, known = cells[learner, week], info.get(week)
        cell.submitted_at = submitted_at
        cell.graders_match = known is not None and known.graders_sha256 == graders
        _latest(cell, results_of[sub_id])
        if known and known.performance:
            cell.score = score({c: f.normalised for c, f in cell.best.items() if f.normalised is not None},
                               list(known.performance))
    learners = sorted({learner for learner, _ in cells})
    return Cohort(gradebook.meta("course") or course.syllabus.title, weeks, learners, cells)


def _latest(cell: Standing, results: list[tuple]) -> None:
    """Fill the cell from the self-reported and the newest verified result of its newest submission."""
    for _id, _sub, origin, tier, device, passed, total, complete, on_gpu, disagreements in results:
        if origin == "self":
            cell.tier, cell.device, cell.total = tier, device, total
            cell.self_passed, cell.self_complete, cell.self_verified_on_gpu = passed, bool(complete), bool(on_gpu)
        else:  # results come oldest first: the last verified one wins
            cell.verified, cell.verified_passed, cell.verified_total = True, passed, total
            cell.verified_complete, cell.disagreements = bool(complete), json.loads(disagreements)


def _keep_best(best: dict[str, Figure], figure: Figure) -> None:
    current = best.get(figure.check)
    if current is None or _better(figure, current):
        best[figure.check] = figure


def _better(new: Figure, old: Figure) -> bool:
    """The larger fraction of ceiling wins. A raw figure (no ceiling to judge it by, so no known direction:
    a bandwidth rises, a latency falls) never beats a normalised one and replaces only an older raw one."""
    if new.normalised is None:
        return old.normalised is None
    return old.normalised is None or new.normalised > old.normalised
