"""Regrading in N worker processes on this machine, and the scratch folder that learner files never outlive.

The instructor's process hands one submission at a time to each worker (`python -m
infracourse.cohort.workers`, a JSON line on its stdin) and gets one `Outcome` back (a JSON line); only the
instructor's process writes the gradebook, one transaction per result, as each arrives. A worker that dies
mid-grade costs only its submission, which is recorded as `error` with the signal, and a fresh worker takes
its place. Where there are GPUs, each worker sees its own (CUDA_VISIBLE_DEVICES) and grades as a machine of
that many GPUs, so per-check timings are not shared between two grades.

Scratch: every worker puts all its temporary files, and those of the grader and sandbox processes under it
(TMPDIR), in `<temp dir>/infracourse-regrade-<uid>/<host>-<pid>-<start time>/`, removed when it ends. (Not
beside the gradebook: the sandbox rebuilds the scratch's parent folders inside itself, and the gradebook's
folder should not appear there even empty.) A worker
dies with the instructor's process (PR_SET_PDEATHSIG), the grader with the worker, the sandbox with the
grader; what a kill -9 leaves on disk is removed by the next regrade's `sweep`, which deletes every folder
whose process is no longer alive (same host; the start time guards against a reused PID).
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Iterator

from infracourse.cohort.gradebook import Gradebook, Submission
from infracourse.cohort.outcome import Outcome, failed_outcome, grade_submission, require_sandbox
from infracourse.course import Course
from infracourse.grading import judges
from infracourse.hardware import Hardware
from infracourse.launch import group



# ---------------------------------------------------------------- planning
def plan(hardware: Hardware, workers: int | None) -> tuple[Hardware, int]:
    """How many workers, and the machine each grades as: one per GPU by default (1 on a CPU machine); with
    GPUs, each worker gets an equal share of them (at least one)."""
    count = max(1, workers or hardware.gpu_count or 1)
    if hardware.gpu_count:
        hardware = replace(hardware, gpu_count=max(1, hardware.gpu_count // count))
    return hardware, count


def _gpus_of(index: int, hardware: Hardware, machine_gpus: int) -> str | None:
    if not machine_gpus:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")  # already restricted: share those out
    ids = visible if len(visible) == machine_gpus and all(visible) else [str(i) for i in range(machine_gpus)]
    first = (index * hardware.gpu_count) % machine_gpus
    return ",".join(ids[(first + i) % machine_gpus] for i in range(hardware.gpu_count))


# ---------------------------------------------------------------- the instructor's side
class _Worker:
    def __init__(self, index: int, spec: dict, gpus: str | None):
        env = dict(os.environ)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        self.proc = subprocess.Popen([sys.executable, "-m", "infracourse.cohort.workers", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.index, self.submission = index, None

    def send(self, sub: Submission) -> None:
        self.submission = sub
        self.proc.stdin.write(json.dumps({"id": sub.id, "week": sub.week, "track": sub.track}) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def run(gradebook: Gradebook, course: Course, pending: list[Submission], hardware: Hardware, count: int,
        machine_gpus: int = 0, *, timeout_scale: float = 1.0, allow_unsandboxed: bool = False,
        on_submission: Callable[[Submission], None] | None = None) -> Iterator:
    """Grade `pending` in `count` worker processes (GPUs shared out of `machine_gpus`); yield each Outcome as
    it comes back."""
    if not pending:
        return
    spec = {"course": str(course.root), "gradebook": str(gradebook.path.resolve()), "hardware": asdict(hardware),
            "timeout_scale": timeout_scale, "allow_unsandboxed": allow_unsandboxed, "parent": os.getpid()}
    workers = [_Worker(i, spec, _gpus_of(i, hardware, machine_gpus)) for i in range(min(count, len(pending)))]
    queue, idle, busy = deque(pending), list(workers), {}
    try:
        while queue or busy:
            while idle and queue:
                worker, sub = idle.pop(), queue.popleft()
                if on_submission:
                    on_submission(sub)
                try:
                    worker.send(sub)
                except OSError:
                    pass  # it died before taking the work: its readline below says so
                busy[worker.proc.stdout.fileno()] = worker
            ready, _, _ = select.select(list(busy), [], [])
            for fd in ready:
                worker = busy.pop(fd)
                line = worker.proc.stdout.readline()
                sub = worker.submission
                if line:
                    yield Outcome.from_dict(json.loads(line))
                    idle.append(worker)
                    continue
                worker.close()
                yield failed_outcome(course, sub.id, sub.week, "the regrade worker process died while grading it "
                                     f"({_ended(worker.proc.returncode)})", hardware, track=sub.track)
                replacement = _Worker(worker.index, spec, _gpus_of(worker.index, hardware, machine_gpus))
                workers[workers.index(worker)] = replacement
                idle.append(replacement)
    finally:
        for worker in workers:
            worker.close()


def _ended(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}; SIGKILL is often the out-of-memory killer"
        except ValueError:
            pass
    return f"exit code {returncode}"


# ---------------------------------------------------------------- scratch
def scratch_root() -> Path:
    """This user's regrade scratch on this machine (a Slurm node's own temp dir for a task)."""
    return Path(tempfile.gettempdir()) / f"infracourse-regrade-{os.getuid()}"


def owner_tag(pid: int | None = None) -> str:
    """`<host>-<pid>-<start time>`: names a process uniquely on this host, even after its PID is reused."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}-{pid}-{_start_time(pid)}"


def alive(tag: str) -> bool:
    """Whether the process a tag names still runs (a tag of another host: assumed alive, it is not ours to
    judge)."""
    try:
        host, pid, start = tag.rsplit("-", 2)
        return host != socket.gethostname() or _start_time(int(pid)) == start
    except ValueError:
        return False  # not a name we make


def sweep() -> list[Path]:
    """Remove scratch folders of regrade processes that are gone (killed mid-grade)."""
    root = scratch_root()
    removed = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not alive(folder.name):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]  # field 22, starttime (after the command name)
    except (OSError, IndexError):
        return "gone"


def own_scratch(root: Path) -> Path:
    """Make this process's scratch folder and send every temporary file of it and its children there."""
    folder = root / owner_tag()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(folder)  # the grader, the worker and the sandbox's scratch inherit it
    tempfile.tempdir = str(folder)
    return folder


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when the one that started it dies (Linux), and exit now if it already has."""
    group.die_with_parent()
    if os.getppid() != parent:
        os._exit(1)


# ---------------------------------------------------------------- the worker's side
def main(spec: dict) -> None:
    die_with_parent(spec["parent"])
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr; stdout carries only outcomes
    folder = own_scratch(scratch_root())
    try:
        require_sandbox(spec["allow_unsandboxed"])  # checked here too: this process starts the sandboxes
        judges.keep_warm()  # a worker grades submission after submission: each judge forks from one interpreter
        course, book = Course(Path(spec["course"])), Gradebook(Path(spec["gradebook"]))
        hardware = Hardware(**spec["hardware"])
        for line in sys.stdin:
            request = json.loads(line)
            outcome = grade_submission(course, request["id"], request["week"], lambda: book.bundle_data(request["id"]),
                                       hardware=hardware, timeout_scale=spec["timeout_scale"],
                                       source=f"{book.path} submission {request['id']}",
                                       track=request.get("track"))
            out.write(json.dumps(outcome.as_dict()) + "\n")
            out.flush()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
