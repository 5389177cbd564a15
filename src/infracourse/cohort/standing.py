"""Where each learner stands in each week: the one reading of the gradebook that export and publish share.

A learner x week is judged on its newest submission: the self-reported result it carried, and the newest
verified result of that submission (from `cohort regrade`), with the checks where the two disagree.
Performance is the best over all of that learner's results for the week, as a fraction of the ceiling of
the device that measured it (cohort.performance), so devices compare fairly; a figure with no ceiling to
judge it by is shown as last recorded.

A project week (22-24) is graded per learner against their track's project: its row in `weeks` counts the
most checks any track has that week and lists every track's performance checks, while each cell's checks,
leaderboard figures and graders match come from the track its newest submission names (`Standing.track`).

With `details=True` (the published site) each cell also carries its submission timeline and the checks its
newest submission fails, read from the stored results (`Gradebook.results_of`) of the submissions that did
not pass every check; `stuck` finds who needs a hand.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from infracourse.cohort.bundle import graders_digest, lab_of
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.performance import performance_checks, score
from infracourse.course import Course
from infracourse.syllabus import CourseFileError


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


@dataclass(frozen=True)
class Failure:
    """A check that did not pass: failed or error (the learner's to fix), or blocked (owed to other hardware)."""
    check: str
    title: str
    status: str
    message: str
    origin: str  # "self" or "verified"


@dataclass
class Attempt:
    """One submission of a learner x week, for the timeline."""
    submitted_at: str
    self_passed: int
    total: int
    self_complete: bool
    verified: bool = False
    verified_passed: int = 0
    verified_total: int = 0
    verified_complete: bool = False
    verified_tier: str = ""
    unsandboxed: bool = False
    failures: list[Failure] = field(default_factory=list)  # of the verified result when there is one

    def failing(self) -> set[str]:
        return {f.check for f in self.failures if f.status in ("failed", "error")}


@dataclass
class Standing:
    learner: str
    week: str
    track: str | None = None  # the project's track (weeks 22-24), as the newest submission names it
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
    verified_best: dict[str, Figure] = field(default_factory=dict)  # the same, regraded figures only: ranks
    score: float | None = None
    graders_match: bool = True
    verified_tier: str = ""
    verified_on_gpu: bool = False
    unsandboxed: bool = False  # its verified result ran without the sandbox (regrade --allow-unsandboxed)
    attempts: list[Attempt] = field(default_factory=list)  # oldest first (details only)

    @property
    def failures(self) -> list[Failure]:
        """What the newest submission did not pass (details only): the verified result's view when regraded."""
        return self.attempts[-1].failures if self.attempts else []

    @property
    def blocked(self) -> int:
        return sum(f.status == "blocked" for f in self.failures)

    @property
    def mark(self) -> str:
        """How the dashboard shows the cell: none | disagrees | verified (regraded: every check ran and passed,
        GPU checks included) | cpu (regraded complete, but its GPU checks were blocked on the regrading
        machine) | self (complete as self-reported, not regraded) | failing. Only a regrade verifies; an
        unsandboxed regrade is flagged beside the mark."""
        if not self.submissions:
            return "none"
        if self.disagreements:
            return "disagrees"
        if self.verified:
            if not self.verified_complete:
                return "failing"
            return "verified" if self.verified_passed == self.verified_total else "cpu"
        return "self" if self.self_complete else "failing"

    @property
    def passing(self) -> bool:
        return self.mark in ("verified", "cpu", "self")

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

    def last_activity(self, learner: str) -> str:
        return max((self.cells[learner, w.id].submitted_at for w in self.weeks if (learner, w.id) in self.cells),
                   default="")


def week_info(course: Course, week, track: str | None = None) -> WeekInfo:
    """What export and publish show of a week: a project week without a track is every track's at once (the
    most checks, each performance check), with no one graders digest."""
    if week.planned:
        return WeekInfo(week.id, week.title, built=False)
    if week.on_track and track is None:
        staged = [week_info(course, week, t) for t in course.tracks]
        return WeekInfo(week.id, week.title, True, max((w.checks for w in staged), default=0),
                        tuple(sorted({c for w in staged for c in w.performance})))
    lab = lab_of(course, week.id, track if week.on_track else None)
    return WeekInfo(week.id, week.title, True, len(lab.spec.checks), tuple(performance_checks(lab)),
                    graders_digest(lab))


def cohort_standing(gradebook: Gradebook, course: Course, *, details: bool = False) -> Cohort:
    weeks = [week_info(course, week) for week in course.syllabus.weeks]
    info = {w.id: w for w in weeks}
    staged: dict[tuple[str, str], WeekInfo | None] = {}  # (project week, track) -> that track's staging

    def known(week: str, track: str | None) -> WeekInfo | None:
        if track is None or week not in info:
            return info.get(week)
        if (week, track) not in staged:
            try:
                staged[week, track] = week_info(course, course.week(week), track)
            except (KeyError, CourseFileError):  # a track this course no longer has: nothing matches it
                staged[week, track] = None
        return staged[week, track]

    snap = gradebook.snapshot()
    results_of: dict[int, list[tuple]] = defaultdict(list)
    for row in snap["results"]:
        results_of[row[1]].append(row)
    figures_of: dict[int, list[tuple]] = defaultdict(list)
    for row in snap["figures"]:
        figures_of[row[0]].append(row)

    cells: dict[tuple[str, str], Standing] = {}
    newest: dict[tuple[str, str], tuple] = {}
    unsandboxed = gradebook.unsandboxed()
    for row in snap["submissions"]:
        sub_id, learner, week, submitted_at = row[:4]  # (later schema versions may add columns)
        cell = cells.setdefault((learner, week), Standing(learner, week))
        cell.submissions += 1
        if details:
            cell.attempts.append(_attempt(gradebook, sub_id, submitted_at, results_of[sub_id]))
        for result_id, _, origin, *_ in results_of[sub_id]:
            for _, check, name, value, unit, norm in figures_of[result_id]:
                _keep_best(cell.best, Figure(check, name, value, unit, norm, origin))
                if origin == "verified":
                    _keep_best(cell.verified_best, Figure(check, name, value, unit, norm, origin))
        seen = newest.get((learner, week))
        if seen is None or (submitted_at, sub_id) > (seen[3], seen[0]):
            newest[learner, week] = row
    tracks = snap.get("tracks", {})
    for (learner, week), (sub_id, _, _, submitted_at, graders, *_) in newest.items():
        cell = cells[learner, week]
        cell.track = tracks.get(sub_id)
        this = known(week, cell.track)
        cell.submitted_at = submitted_at
        cell.graders_match = this is not None and this.graders_sha256 == graders
        cell.unsandboxed = (learner, week) in unsandboxed
        _latest(cell, results_of[sub_id])
        if this and this.performance:
            cell.score = score(cell.verified_best,
                               list(this.performance))
    learners = sorted({learner for learner, _ in cells} | set(snap.get("roster", ())))  # never-submitted too
    for cell in cells.values():
        cell.attempts.sort(key=lambda a: a.submitted_at)
    return Cohort(gradebook.meta("course") or course.syllabus.title, weeks, learners, cells)


def _latest(cell: Standing, results: list[tuple]) -> None:
    """Fill the cell from the self-reported and the newest verified result of its newest submission."""
    for row in results:
        _id, _sub, origin, tier, device, passed, total, complete, on_gpu, disagreements = row[:10]
        if origin == "self":
            cell.tier, cell.device, cell.total = tier, device, total
            cell.self_passed, cell.self_complete, cell.self_verified_on_gpu = passed, bool(complete), bool(on_gpu)
        else:  # results come oldest first: the last verified one wins
            cell.verified, cell.verified_passed, cell.verified_total = True, passed, total
            cell.verified_complete, cell.disagreements = bool(complete), json.loads(disagreements)
            cell.verified_tier, cell.verified_on_gpu = tier, bool(on_gpu)


def _attempt(gradebook: Gradebook, sub_id: int, submitted_at: str, results: list[tuple]) -> Attempt:
    """One submission's line of the timeline. The checks it did not pass come from its newest verified
    result (else the self-reported one), read only when that result did not pass every check."""
    attempt = Attempt(submitted_at, 0, 0, False)
    for row in results:
        _id, _sub, origin, tier, _device, passed, total, complete = row[:8]
        if origin == "self":
            attempt.self_passed, attempt.total, attempt.self_complete = passed, total, bool(complete)
        else:
            attempt.verified, attempt.verified_passed, attempt.verified_total = True, passed, total
            attempt.verified_complete, attempt.verified_tier = bool(complete), tier
    origin = "verified" if attempt.verified else "self"
    passed, total = (attempt.verified_passed, attempt.verified_total) if attempt.verified \
        else (attempt.self_passed, attempt.total)
    if passed < total or attempt.verified:  # a verified result is read whole: was it sandboxed?
        stored = gradebook.results_of(sub_id, origin)
        if stored:
            result = stored[-1][1]
            attempt.unsandboxed = origin == "verified" and not result.sandboxed
            attempt.failures = [Failure(c.id, c.title, c.status, c.message, origin)
                                for c in result.checks if c.status != "passed"]
    return attempt


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


@dataclass(frozen=True)
class Stuck:
    """A learner who needs a hand: `week` and `checks` set when the same check failed in each of the last
    `attempts` submissions of that week; `week` empty when they have not submitted for `idle_days`."""
    learner: str
    week: str
    checks: tuple[str, ...]
    attempts: int
    idle_days: int
    since: str  # the submission the reason dates from
    message: str = ""


def stuck(cohort: Cohort, *, attempts: int = 3, idle_days: int = 7, now: datetime | None = None) -> list[Stuck]:
    """Who is stuck (needs `details`): the same check failed across the last `attempts` submissions of a
    week they have not passed since, or no submission for `idle_days` days while they have not passed a
    week the cohort has reached (one someone submitted, or an earlier one)."""
    now = now or datetime.now(timezone.utc)
    found = []
    # a week nobody has submitted yet is not owed: idleness counts only weeks up to the cohort's newest
    started = [w for w in cohort.built_weeks() if any((l, w.id) in cohort.cells for l in cohort.learners)]
    owed = cohort.built_weeks()[:cohort.built_weeks().index(started[-1]) + 1] if started else []
    for learner in cohort.learners:
        for week in cohort.built_weeks():
            cell = cohort.cell(learner, week.id)
            recent = cell.attempts[-attempts:]
            if cell.passing or len(recent) < attempts:
                continue
            common = set.intersection(*(a.failing() for a in recent))
            if common:
                first = next(f for f in cell.failures if f.check in common) if cell.failures else None
                found.append(Stuck(learner, week.id, tuple(sorted(common)), len(cell.attempts), 0,
                                   recent[0].submitted_at, first.message if first else ""))
        last = _when(cohort.last_activity(learner))
        unpassed = any(not cohort.cell(learner, w.id).passing for w in owed)
        if unpassed and (last is None or now - last >= timedelta(days=idle_days)):
            found.append(Stuck(learner, "", (), 0, (now - last).days if last else -1,
                               cohort.last_activity(learner)))
    return found


def _when(stamp: str) -> datetime | None:
    """A gradebook time as UTC (anything unreadable counts as no activity)."""
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
