"""What this machine can do of the weeks still ahead (003 §10): `infracourse doctor --plan`.

For each remaining week: the checks that will run here, those that will be blocked and why, and, for the blocked
GPU checks, what to rent (GPUs in one machine, device minutes, memory: the syllabus' `gpu:` budget of the week,
from the reference's grade time on an H200). Checks needing a container engine, a cluster, several nodes or an MLU
are listed with what they need; they stay `blocked` and go in the report's to-be-verified list, never simulated.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from infracourse.course import Course
from infracourse.hardware import Hardware
from infracourse.syllabus import GpuBudget

GPU_NEEDS = ("cuda", "multi-gpu")


@dataclass
class WeekPlan:
    week: str
    title: str
    runs: list[str] = field(default_factory=list)
    blocked: list[tuple[str, str]] = field(default_factory=list)  # (check, why)
    rent: GpuBudget | None = None  # the GPUs to rent for the blocked GPU checks, if any
    note: str = ""  # a week that cannot be planned yet (planned lab, no track chosen)


def plan(course: Course, hw: Hardware, done: set[str] = frozenset()) -> list[WeekPlan]:
    """Every built week not in `done` (weeks already passed), in syllabus order."""
    rows = []
    for week in course.syllabus.weeks:
        if week.id in done:
            continue
        row = WeekPlan(week.id, week.title)
        if week.planned:
            row.note = "planned: no lab yet"
        elif week.on_track and course.track_id is None:
            row.note = "the project of the track you choose (`infracourse track list`)"
        else:
            for check in course.lab(week).spec.checks:
                if hw.satisfies(check.needs):
                    row.runs.append(check.id)
                else:
                    row.blocked.append((check.id, hw.missing(check.needs)))
            needs = {course.lab(week).spec.check(c).needs for c, _ in row.blocked}
            budget = course.track().gpu if week.on_track else week.gpu
            if budget and any(n.startswith(GPU_NEEDS) for n in needs):
                row.rent = budget
        rows.append(row)
    return rows


def rent_total(rows: list[WeekPlan]) -> dict[int, float]:
    """Device minutes to rent, by GPUs per machine."""
    total: dict[int, float] = {}
    for row in rows:
        if row.rent:
            total[row.rent.devices] = total.get(row.rent.devices, 0.0) + row.rent.minutes
    return total
