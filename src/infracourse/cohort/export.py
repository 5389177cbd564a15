"""The gradebook as a table: CSV for spreadsheets, JSON for tools (after otter-grader's export), and the
grade-import CSVs of Canvas and Moodle.

One row per learner x built week, including weeks a learner has not submitted (state `none`) and learners
on the roster who never submitted, so a spreadsheet shows who is missing; `track` names the project a week
22-24 submission was graded on (empty for other weeks). Columns are `COLUMNS`; JSON rows
carry the same keys with the best performance figures structured instead of flattened.

`points` (0-100) is what an LMS gets: the share of the week's checks passed *in the instructor's regrade*
(a self-reported result earns nothing until regraded: only regrade verifies), times the late policy's
factor (cohort.deadlines). A week not handed in is 0 once its deadline has passed, blank before.
LMS formats, one row per learner and one column per built week:
  canvas   `Student, ID, SIS User ID, SIS Login ID, Section, <week>...` and a `Points Possible` row, as
           Canvas's gradebook export writes it and its import reads it (rows match on ID, SIS User ID or SIS
           Login ID: put them in the roster's canvas_id / sis_user_id / sis_login_id columns)
  moodle   `Email address, ID number, Full name, <week>...`: in Moodle's Grades > Import > CSV file, map
           "Email address" (or "ID number") to the user field of the same name and each week to its item
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from infracourse.cohort import deadlines, rubric
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.roster import Learner
from infracourse.cohort.standing import Cohort, Standing, cohort_standing
from infracourse.course import Course

FORMAT_VERSION = 2
COLUMNS = ("learner", "week", "track", "state", "submissions", "submitted_at", "device", "tier", "checks",
           "self_passed", "self_complete", "verified", "verified_passed", "verified_complete", "verified_sandboxed",
           "disagreements", "best_score", "best_figures", "graders_match", "on_roster", "late", "late_hours", "points",
           "review_points", "review_max", "reviewers")
FORMATS = ("csv", "json", "canvas", "moodle")
CANVAS_IDS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
MOODLE_IDS = ("Email address", "ID number", "Full name")


class ExportError(Exception):
    """The export cannot be written; the message says why and what to do."""


def export(gradebook: Gradebook, course: Course, out: Path, *, format: str | None = None) -> Path:
    """Write the gradebook to `out`: `format` csv, json, canvas or moodle (default: by suffix, .csv / .json)."""
    out = Path(out)
    format = format or out.suffix.lstrip(".")
    if format not in FORMATS:
        raise ExportError(f"{out}: name the file .csv (one row per learner x week) or .json (the same, structured), "
                          "or pass --format canvas / moodle (an LMS grade import)")
    if format in ("canvas", "moodle") and out.suffix != ".csv":
        raise ExportError(f"{out}: an LMS grade import is a .csv file")
    cohort = cohort_standing(gradebook, course)
    config = deadlines.load(gradebook.path)
    roster = {learner.id: learner for learner, _ in gradebook.roster()}
    unsandboxed = gradebook.unsandboxed()  # regraded with --allow-unsandboxed: learner code ran unconfined
    reviews = rubric.review_columns(gradebook, course)  # the rubric scores of `cohort review`
    rows = [row(cell) | {"track": cell.track}  # the published site's rows (row()) leave it out
            | {"verified_sandboxed": (cell.learner, cell.week) not in unsandboxed if cell.verified else None}
            | graded(cell, config, learner in roster) | reviews.get((learner, week.id), rubric.NO_REVIEW)
            for learner in cohort.learners for week in cohort.built_weeks()
            for cell in [cohort.cell(learner, week.id)]]
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    if format in ("canvas", "moodle"):
        with part.open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(lms_table(format, cohort, rows, roster))
    elif format == "csv":
        with part.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows({k: _cell(v) for k, v in {**r, "disagreements": describe(r["disagreements"]),
                                                          "best_figures": _flat_figures(r)}.items()
                              if k != "review"} for r in rows)  # each reviewer's scores: JSON only
    else:
        part.write_text(json.dumps(document(cohort, rows), indent=1), encoding="utf-8")
    part.replace(out)
    return out


def graded(cell: Standing, config: deadlines.CohortConfig, on_roster: bool) -> dict:
    """The columns the late policy and the LMS read: lateness of the newest submission and its points."""
    late = deadlines.lateness(config, cell.week, cell.submitted_at) if cell.submissions else deadlines.Lateness()
    if cell.verified and cell.verified_total:
        points = round(100 * cell.verified_passed / cell.verified_total * late.factor, 2)
    elif not cell.submissions and deadlines.past_deadline(config, cell.week):
        points = 0
    else:
        points = None  # not regraded yet, or not due yet: an LMS leaves a blank cell as it is
    return {"on_roster": on_roster, "late": late.late, "late_hours": round(late.hours, 2) if late.late else None,
            "points": points}


def lms_table(format: str, cohort: Cohort, rows: list[dict], roster: dict[str, Learner]) -> list[list]:
    """Header, (Canvas) Points Possible, then one row per learner: ids the LMS matches on, points per week."""
    weeks = cohort.built_weeks()
    points = {(r["learner"], r["week"]): r["points"] for r in rows}
    titles = [f"infracourse {w.id}: {w.title}" for w in weeks]
    # a week with a rubric gets a second column, the review's points (its own assignment in the LMS)
    reviewed = {w.id: max(r["review_max"] for r in rows if r["week"] == w.id and r["review_max"] is not None)
                for w in weeks if any(r["week"] == w.id and r["review_max"] is not None for r in rows)}
    review = {(r["learner"], r["week"]): r["review_points"] for r in rows}
    titles += [f"infracourse {w.id} review: {w.title}" for w in weeks if w.id in reviewed]
    table: list[list] = []
    if format == "canvas":
        table += [[*CANVAS_IDS, *titles], ["Points Possible", "", "", "", "", *([100] * len(weeks)),
                                           *reviewed.values()]]
    else:
        table.append([*MOODLE_IDS, *titles])
    for learner in cohort.learners:
        who = roster.get(learner) or Learner(learner, learner, "")
        ids = [who.name or who.id, who.canvas_id, who.sis_user_id, who.sis_login_id, who.section] \
            if format == "canvas" else [who.email, who.idnumber, who.name]
        table.append([_cell(v) for v in ids] + ["" if points[learner, w.id] is None else points[learner, w.id]
                                                for w in weeks]
                     + ["" if review[learner, week] is None else review[learner, week] for week in reviewed])
    return table


def row(cell: Standing) -> dict:
    return {
        "learner": cell.learner, "week": cell.week, "state": cell.state, "submissions": cell.submissions,
        "submitted_at": cell.submitted_at, "device": cell.device, "tier": cell.tier, "checks": cell.total,
        "self_passed": cell.self_passed, "self_complete": cell.self_complete, "verified": cell.verified,
        "verified_passed": cell.verified_passed if cell.verified else None,
        "verified_complete": cell.verified_complete if cell.verified else None,
        "disagreements": cell.disagreements,
        "best_score": None if cell.score is None else round(cell.score, 4),
        "best_figures": {check: {"name": f.name, "value": f.value, "unit": f.unit, "origin": f.origin,
                                 "fraction_of_ceiling": f.normalised} for check, f in sorted(cell.best.items())},
        "graders_match": cell.graders_match if cell.submissions else None,
    }


def document(cohort: Cohort, rows: list[dict]) -> dict:
    return {"format_version": FORMAT_VERSION, "course": cohort.title,
            "weeks": [{"id": w.id, "title": w.title, "checks": w.checks, "performance_checks": list(w.performance)}
                      for w in cohort.built_weeks()],
            "learners": cohort.learners, "rows": rows}


def describe(disagreements: list[dict]) -> str:
    """'check: self passed, verified failed; ...' in one line."""
    return "; ".join(f"{d['check']}: self {d['self']}, verified {d['verified']}" for d in disagreements)


def _flat_figures(r: dict) -> str:
    parts = []
    for check, f in r["best_figures"].items():
        share = "" if f["fraction_of_ceiling"] is None else f" ({f['fraction_of_ceiling']:.0%} of ceiling)"
        parts.append(f"{check}: {f['value']:.4g}{' ' + f['unit'] if f['unit'] else ''}{share}")
    return "; ".join(parts)


def _cell(value):
    """Text a spreadsheet would run as a formula (a self-reported device name can be anything) is quoted."""
    return "'" + value if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r") else value
