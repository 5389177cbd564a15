"""Regrading on the instructor's machine: the learner's files, this course's graders, a verified result.

Each submission is unpacked into its own fresh temporary folder and graded by `grading.runner.grade`: a
grader subprocess per run, per-check timeouts, fail-closed (a crash or hang is an `error`, never a pass).
The result is stored whole, in one transaction, beside the learner's self-reported one; a kill -9 between
two submissions loses only the ones being graded, and running `cohort regrade` again picks up from there.

One bad submission never stops the others: whatever goes wrong with it (a bundle that no longer parses, a
file name the disk refuses, a grade that crashes, a worker that dies) is stored as its verified result, every
check `error` with the reason, and the rest go on. Where the grading happens is the caller's choice: in
worker processes on this machine (`cohort.workers`, one per GPU where there are GPUs) or as a Slurm job
array (`cohort.slurm`). Both run `cohort.outcome.grade_submission` and hand back an `Outcome`, which only this
module writes into the gradebook.

Learner code runs only in the grading worker's sandbox (infracourse.sandbox): it cannot see the gradebook,
the graders, the other submissions or the network, and nothing it starts outlives the grade. Where no
sandbox can be made, regrading refuses unless the instructor passes `allow_unsandboxed` (then learner code
runs with the instructor's user rights, and every such result says `sandboxed: false`). A worker or a Slurm
task checks again for itself, so a node without a sandbox refuses too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from infracourse.cohort import slurm as slurm_mode, workers as local_mode
from infracourse.cohort.gradebook import Gradebook, Submission
from infracourse.cohort.outcome import Outcome, describe_failure, failed_outcome, require_sandbox
from infracourse.course import Course
from infracourse.grading.results import GradeResult
from infracourse.hardware import Hardware, detect
from infracourse.syllabus import normalise_week


@dataclass
class Regraded:
    submission: Submission
    self_reported: GradeResult | None
    verified: GradeResult
    disagreements: list[dict]
    error: str | None = None  # why this submission could not be graded (its checks are all `error`)


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
