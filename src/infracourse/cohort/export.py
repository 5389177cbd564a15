"""The gradebook as a table: CSV for spreadsheets and LMS uploads, JSON for tools (after otter-grader's export).

One row per learner x built week, including weeks a learner has not submitted (state `none`), so a
spreadsheet shows who is missing. Columns are `COLUMNS`; JSON rows carry the same keys with the best
performance figures structured instead of flattened.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.standing import Cohort, Standing, cohort_standing
from infracourse.course import Course

FORMAT_VERSION = 1
COLUMNS = ("learner", "week", "state", "submissions", "submitted_at", "device", "tier", "checks", "self_passed",
           "self_complete", "verified", "verified_passed", "verified_complete", "verified_sandboxed", "disagreements",
           "best_score", "best_figures", "graders_match")


class ExportError(Exception):
    """The export cannot be written; the message says why and what to do."""


def export(gradebook: Gradebook, course: Course, out: Path) -> Path:
    """Write the gradebook to `out`: CSV or JSON, chosen by its suffix (.csv / .json)."""
    out = Path(out)
    if out.suffix not in (".csv", ".json"):
        raise ExportError(f"{out}: name the file .csv (one row per learner x week) or .json (the same, structured)")
    cohort = cohort_standing(gradebook, course)
    unsandboxed = gradebook.unsandboxed()  # regraded with --allow-unsandboxed: learner code ran unconfined
    rows = [row(cell) | {"verified_sandboxed": (cell.learner, cell.week) not in unsandboxed if cell.verified else None}
            for learner in cohort.learners for week in cohort.built_weeks()
            for cell in [cohort.cell(learner, week.id)]]
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    if out.suffix == ".csv":
        with part.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows({k: _cell(v) for k, v in {**r, "disagreements": describe(r["disagreements"]),
                                                          "best_figures": _flat_figures(r)}.items()} for r in rows)
    else:
        part.write_text(json.dumps(document(cohort, rows), indent=1), encoding="utf-8")
    part.replace(out)
    return out


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
