"""The course's completion criteria (003 §11), each backed by checks, and the certificate that states them.

The syllabus' `completion:` section lists the criteria and the `weekNN:check-id` entries behind each (project weeks
22-24 name checks of the chosen track's project). Given the grades of a learner (a workspace's last grade per week,
or an instructor's regrades from the gradebook), each criterion is:
- `met`: every backing check passed;
- `met, to be verified`: every backing check passed or was blocked (the hardware was missing: 003 §10 — what needs
  the missing device is owed to a run there, never simulated);
- `not met`: a backing check failed, errored or was never graded.
The certificate (JSON, and a page for people) names every backing check with the grade it comes from (when, tier,
device, and a digest of the stored result), so an instructor can verify it against the gradebook's own regrades
(`verify_certificate`).
"""
from __future__ import annotations

import hashlib
import html
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Mapping

from infracourse import __version__
from infracourse.course import Course
from infracourse.grading.results import GradeResult

MET, MET_TO_VERIFY, NOT_MET = "met", "met, to be verified", "not met"


@dataclass
class Backing:
    week: str
    check: str
    status: str  # passed / failed / error / blocked / not graded
    graded_at: str | None = None
    tier: str | None = None
    device: str | None = None
    result_sha256: str | None = None


@dataclass
class CriterionState:
    id: str
    text: str
    state: str
    backing: list[Backing] = field(default_factory=list)


def result_digest(result: GradeResult) -> str:
    """A digest of a stored grade: the same result read back from anywhere gives the same digest."""
    return hashlib.sha256(json.dumps(result.as_dict(), sort_keys=True).encode()).hexdigest()


def completion(course: Course, results: Mapping[str, GradeResult]) -> list[CriterionState]:
    """Each criterion of the syllabus' completion section against `results` (week id -> that week's grade)."""
    states = []
    for criterion in course.syllabus.completion:
        backing = []
        for entry in criterion.checks:
            week, check = entry.split(":", 1)
            result = results.get(week)
            found = next((c for c in result.checks if c.id == check), None) if result else None
            backing.append(Backing(week, check, found.status if found else "not graded",
                                   result.started_at if result else None, result.tier if result else None,
                                   result.device if result else None, result_digest(result) if result else None))
        statuses = {b.status for b in backing}
        state = MET if statuses == {"passed"} else MET_TO_VERIFY if statuses <= {"passed", "blocked"} else NOT_MET
        states.append(CriterionState(criterion.id, criterion.text, state, backing))
    return states


def certificate(course: Course, results: Mapping[str, GradeResult], *, learner: str | None,
                track: str | None) -> dict:
    states = completion(course, results)
    return {"kind": "infracourse-completion", "format_version": 1, "course": course.syllabus.title,
            "learner": learner, "track": track, "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "infracourse_version": __version__,
            "complete": all(s.state != NOT_MET for s in states),
            "to_be_verified": sorted({f"{b.week}:{b.check}" for s in states for b in s.backing if b.status == "blocked"}),
            "criteria": [asdict(s) for s in states]}


def verify_certificate(cert: dict, course: Course, results: Mapping[str, GradeResult]) -> list[str]:
    """What in a certificate the grades in `results` (an instructor's regrades) do not bear out; [] when all do.
    A criterion claimed met must be met by these grades; a backing check claimed passed must have passed."""
    if cert.get("kind") != "infracourse-completion":
        return ["not an infracourse completion certificate (kind is missing or different)"]
    ours = {s.id: s for s in completion(course, results)}
    problems = []
    for claimed in cert.get("criteria", []):
        mine = ours.get(claimed.get("id"))
        if mine is None:
            problems.append(f"criterion {claimed.get('id')!r} is not in this course's completion section")
            continue
        if claimed.get("state") != NOT_MET and mine.state == NOT_MET:
            failing = [f"{b.week}:{b.check} {b.status}" for b in mine.backing if b.status not in ("passed", "blocked")]
            problems.append(f"{mine.id}: the certificate says {claimed.get('state')!r}, the gradebook's grades say "
                            f"not met ({', '.join(failing)})")
        for entry in claimed.get("backing", []):
            theirs = next((b for b in mine.backing if (b.week, b.check) == (entry.get("week"), entry.get("check"))), None)
            if theirs and entry.get("status") == "passed" and theirs.status != "passed":
                problems.append(f"{mine.id}: {theirs.week}:{theirs.check} is 'passed' on the certificate but "
                                f"{theirs.status!r} in the gradebook")
    return problems


def certificate_page(cert: dict) -> str:
    """A self-contained HTML page of a certificate (every value escaped)."""
    e = lambda v: html.escape(str(v if v is not None else "-"))  # noqa: E731
    rows = []
    for c in cert["criteria"]:
        checks = "<br>".join(f"{e(b['week'])}:{e(b['check'])} — {e(b['status'])}"
                             f"{' (' + e(b['graded_at']) + ', ' + e(b['device']) + ')' if b['graded_at'] else ''}"
                             for b in c["backing"])
        rows.append(f"<tr class='{e(c['state']).replace(' ', '-').replace(',', '')}'><td>{e(c['text'])}</td>"
                    f"<td>{e(c['state'])}</td><td>{checks}</td></tr>")
    verified = "".join(f"<li>{e(x)}</li>" for x in cert["to_be_verified"]) or "<li>none</li>"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{e(cert['course'])}: completion</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td{{vertical-align:top;padding:.4em;border-top:1px solid #ccc}}
.met td:nth-child(2){{color:#060}}.not-met td:nth-child(2){{color:#a00}}.met-to-be-verified td:nth-child(2){{color:#a60}}</style></head>
<body><h1>{e(cert['course'])}</h1>
<p>Learner <b>{e(cert['learner'])}</b>, track <b>{e(cert['track'])}</b>; issued {e(cert['issued_at'])} by infracourse
{e(cert['infracourse_version'])}. <b>{'Complete' if cert['complete'] else 'Not complete'}</b>.</p>
<table><tr><th>criterion</th><th>state</th><th>backed by</th></tr>{''.join(rows)}</table>
<h2>To be verified on hardware this learner did not have</h2><ul>{verified}</ul>
<p>An instructor verifies this page's JSON against the gradebook: <code>infracourse cohort verify-certificate FILE.json</code>.</p>
</body></html>
"""
