"""Regrading as a Slurm job array, for cohorts that outgrow one machine.

Why a plain `sbatch --array` and not submitit: it needs nothing on the cluster but Slurm and this Python
environment (no extra dependency, no pickled functions on a shared disk: a task reads JSON and bundles), the
array's `%limit` throttles it natively, and the same command can be read and rerun by hand.

The instructor's process writes a job folder beside the gradebook (`.regrade-jobs/<owner>/`: each bundle,
one JSON slice per array task; no learner file is unpacked there) and submits `python -m infracourse.cohort.slurm JOBDIR`. Each task detects its
node's hardware, unpacks in the node's own temp dir (`workers.own_scratch`), refuses to run without a sandbox unless allowed (the same `regrade` code as a local
worker), and for each submission of its slice marks it started, grades it (`outcome.grade_submission`) and
writes `results/<id>.json` whole (written aside, then renamed), so a result file is complete or absent. The
instructor's process polls, records each result file in its own transaction as it appears, then removes it.
When the job has left the queue, a submission marked started without a result (its task died: time limit,
out of memory, node failure) is recorded as `error`; one its task never reached is left for the next run.
If the instructor's process itself is killed, the next regrade finds the orphaned job folder, cancels its
job, records the results it holds and removes it.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from infracourse.cohort.gradebook import Gradebook, Submission
from infracourse.cohort.outcome import Outcome, failed_outcome, grade_submission, require_sandbox
from infracourse.cohort.workers import alive, own_scratch, owner_tag, scratch_root, sweep
from infracourse.course import Course
from infracourse.launch.output import last_lines, read_tail  # a task's log holds what its grades printed
from infracourse.hardware import detect

JOBS = ".regrade-jobs"


class SlurmError(Exception):
    """The job could not be submitted; the message says what sbatch answered."""


@dataclass
class SlurmOptions:
    partition: str | None = None
    time: str | None = None  # per array task, Slurm's format (e.g. 01:00:00)
    array_limit: int | None = None  # at most this many tasks at once (--array=...%N)
    tasks: int | None = None  # array size (default: one task per 4 submissions, at most 500)
    sbatch_args: list[str] = field(default_factory=list)  # anything else, e.g. --gres=gpu:1, --account=X
    poll_s: float = 5.0


def run(gradebook: Gradebook, course: Course, pending: list[Submission], options: SlurmOptions, *,
        timeout_scale: float = 1.0, allow_unsandboxed: bool = False,
        on_submission: Callable[[Submission], None] | None = None,
        on_note: Callable[[str], None] | None = None) -> Iterator:
    """Submit `pending` as one job array; yield each Outcome as its result file appears."""
    if not pending:
        return
    job = jobs_root(gradebook) / owner_tag()
    _write_job(job, gradebook, course, pending, options, timeout_scale, allow_unsandboxed)
    job_id = _submit(job, options, min(options.tasks or -(-len(pending) // 4), 500, len(pending)))
    (job / "job_id").write_text(job_id)
    for sub in pending:
        if on_submission:
            on_submission(sub)
    try:
        while _queued(job_id):
            yield from _collect(job)
            time.sleep(options.poll_s)
        yield from _finish(job, course, on_note)
    finally:
        if _queued(job_id):  # interrupted (Ctrl-C, an error): nothing keeps running behind our back
            subprocess.run(["scancel", job_id], capture_output=True)
        shutil.rmtree(job, ignore_errors=True)


def recover(gradebook: Gradebook, course: Course) -> Iterator[tuple[Submission, object]]:
    """Job folders of killed regrades: cancel the job, yield (submission, outcome) of each result it holds,
    remove the folder."""
    root = jobs_root(gradebook)
    for job in sorted(root.iterdir()) if root.is_dir() else []:
        if alive(job.name):
            continue
        if (job / "job_id").is_file():
            subprocess.run(["scancel", (job / "job_id").read_text().strip()], capture_output=True)
        subs = {e["id"]: Submission(**e) for f in (job / "tasks").glob("*.json") for e in json.loads(f.read_text())}
        for outcome in _collect(job):
            if outcome.submission_id in subs:
                yield subs[outcome.submission_id], outcome
        shutil.rmtree(job, ignore_errors=True)


def jobs_root(gradebook: Gradebook) -> Path:
    return gradebook.path.resolve().parent / JOBS


def _write_job(job: Path, gradebook: Gradebook, course: Course, pending: list[Submission], options: SlurmOptions,
               timeout_scale: float, allow_unsandboxed: bool) -> None:
    for sub in ("bundles", "tasks", "results", "started", "logs"):
        (job / sub).mkdir(parents=True, exist_ok=True)
    tasks = min(options.tasks or -(-len(pending) // 4), 500, len(pending))
    for sub in pending:
        (job / "bundles" / f"{sub.id}.zip").write_bytes(gradebook.bundle_data(sub.id))
    for i in range(tasks):
        (job / "tasks" / f"{i}.json").write_text(json.dumps([asdict(s) for s in pending[i::tasks]]))
    (job / "spec.json").write_text(json.dumps({"course": str(course.root.resolve()), "timeout_scale": timeout_scale,
                                               "allow_unsandboxed": allow_unsandboxed}))


def _submit(job: Path, options: SlurmOptions, tasks: int) -> str:
    array = f"0-{tasks - 1}" + (f"%{options.array_limit}" if options.array_limit else "")
    command = ["sbatch", "--parsable", "--job-name=infracourse-regrade", f"--array={array}",
               f"--output={job / 'logs' / '%a.log'}", f"--chdir={job}"]
    command += [f"--partition={options.partition}"] if options.partition else []
    command += [f"--time={options.time}"] if options.time else []
    command += [*options.sbatch_args, "--wrap",
                shlex.join([sys.executable, "-m", "infracourse.cohort.slurm", str(job)])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"sbatch could not be run ({exc}); is this a Slurm login node?") from None
    if done.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def _queued(job_id: str) -> bool:
    """Whether any task of the job is still pending or running."""
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True)
    return done.returncode == 0 and bool(done.stdout.strip())


def _collect(job: Path) -> Iterator:
    """Each whole result file present, as an Outcome; the file is removed once the caller has recorded it
    (the generator resumes only after that)."""
    for path in sorted((job / "results").glob("*.json")):
        outcome = Outcome.from_dict(json.loads(path.read_text()))
        yield outcome
        path.unlink()
        (job / "started" / path.stem).unlink(missing_ok=True)


def _finish(job: Path, course: Course, on_note) -> Iterator:
    """After the job: the last results, then each submission whose task died while grading it (`error`) and
    a note on the ones no task reached (left for the next run)."""
    yield from _collect(job)
    hardware = detect()
    unreached = []
    for path in sorted((job / "tasks").glob("*.json"), key=lambda p: int(p.stem)):
        for entry in json.loads(path.read_text()):
            if (job / "started" / str(entry["id"])).exists():
                log = job / "logs" / f"{path.stem}.log"
                tail = last_lines(read_tail(log), 3).replace("\n", " | ")
                yield failed_outcome(course, entry["id"], entry["week"], f"its Slurm task {path.stem} ended while "
                                     f"grading it (time limit, memory or node failure; last log lines: {tail[-400:]})",
                                     hardware, track=entry.get("track"))
            elif not any((job / "results").glob(f"{entry['id']}.json")):
                unreached.append(f"{entry['learner']} {entry['week']}")
    if unreached and on_note:
        log = (job / "logs" / "0.log")
        why = last_lines(read_tail(log), 3).replace("\n", " | ")
        on_note(f"{len(unreached)} submission(s) not reached by their Slurm task, left for the next regrade: "
                f"{', '.join(unreached[:10])}" + (f" (task 0 log: {why[-400:]})" if why else ""))


# ---------------------------------------------------------------- one array task, on a compute node
def task(job: Path, index: int) -> None:
    spec = json.loads((job / "spec.json").read_text())
    sweep()  # what killed tasks left on this node
    folder = own_scratch(scratch_root())
    try:
        require_sandbox(spec["allow_unsandboxed"])  # the node must have a sandbox too
        course, hardware = Course(Path(spec["course"])), detect()
        for entry in json.loads((job / "tasks" / f"{index}.json").read_text()):
            result = job / "results" / f"{entry['id']}.json"
            if result.exists():
                continue  # a requeued task: done already
            (job / "started" / str(entry["id"])).touch()
            bundle = job / "bundles" / f"{entry['id']}.zip"
            outcome = grade_submission(course, entry["id"], entry["week"], bundle.read_bytes, hardware=hardware,
                                       timeout_scale=spec["timeout_scale"], source=f"{entry['source']} (job {job.name})",
                                       track=entry.get("track"))
            data = outcome.as_dict()
            data["environment"]["slurm"] = {"job": os.environ.get("SLURM_ARRAY_JOB_ID"), "task": index,
                                            "node": os.environ.get("SLURMD_NODENAME")}
            part = result.with_suffix(".part")
            part.write_text(json.dumps(data))
            os.replace(part, result)  # whole or absent
            print(f"graded {entry['learner']} {entry['week']}: {outcome.error or 'ok'}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    task(Path(sys.argv[1]), int(os.environ["SLURM_ARRAY_TASK_ID"]))
