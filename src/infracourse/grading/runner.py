"""The runner: grades a week on a snapshot of the learner's files, failing closed (see grading.protocol).

It decides here, from the hardware it detected, which checks are `blocked`, and never asks anyone else.
The judge process (pytest with the graders) sends a `start` and a `result` event per check on a pipe it
inherited; a result is accepted only for a check id of lab.yaml, only once, and only after that check's
own start, and its figures only as grading.results.Figure accepts them. A check with `requires` gets credit
only if every required check was accepted as passed. lab.yaml is parsed once per grade, here: the judge gets
the parsed spec as JSON in the runner's private temporary folder (written afresh before each judge process
starts; the sandboxed worker does not see that folder). A check that overruns its timeout gets the judge's
process group killed (the sandboxed worker dies with it); a judge that dies leaves its running check as
`error`, and grading goes on in a fresh process for the checks not yet settled, handed what the grade settled
so far (statuses and figures: protocol.write_settled), so its report check compares figures measured before
the restart. Every check in lab.yaml ends with a status; one never reported is an `error`.

One grade's state is a `GradeSession`; one judge process's, as the runner sees it, a `JudgeRun`.
"""
from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from infracourse import __version__, kit_access, sandbox
from infracourse.course import Course, LabDir
from infracourse.grading import judges
from infracourse.grading.protocol import (COMPILE_CACHE_ENV, FATAL_EXIT, ProtocolError, validate_event,
                                         write_settled)
from infracourse.launch import group, hangs
from infracourse.launch.output import read_tail
from infracourse.grading.results import CheckResult, FigureError, GradeResult, figures_of
from infracourse.grading.selection import with_prerequisites
from infracourse.hardware import Hardware, detect

IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".backup-*", ".grade", ".ipynb_checkpoints")
POLL_S = 0.05
# Under the Triton interpreter (no GPU) every program instance of a kernel runs as Python, about 10 ms each
# whatever its tile: a correct kernel with small tiles (a 2-D grid of 8x128 tiles over a 1-row input) takes
# ~80 us per input element. So there each learner call gets the check's limit plus this much per element of
# its tensor inputs (the judge's own count): a hang still ends, a correct kernel with small tiles does not.
INTERPRETER_S_PER_ELEMENT = 250e-6

EventHandler = Callable[[dict], None]


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        meaning = {"SIGSEGV": "segmentation fault", "SIGKILL": "killed, often by the out-of-memory killer",
                   "SIGABRT": "aborted", "SIGBUS": "bus error", "SIGFPE": "arithmetic error"}.get(name, "")
        return f"{name} ({meaning})" if meaning else name
    if returncode == FATAL_EXIT:
        return "a CUDA error that leaves the device unusable (the rest ran in a fresh process)"
    return f"exit code {returncode}"


def grade(course: Course, week_ref: str | int | LabDir, files_dir: Path, *, hardware: Hardware | None = None,
          on_event: EventHandler | None = None, timeout_scale: float = 1.0,
          compile_cache: Path | None = None, checks: Iterable[str] | None = None) -> GradeResult:
    """Grade the learner files in `files_dir` for one week (a week reference, or a LabDir the caller has
    already loaded: then lab.yaml is not read again). Never raises for learner faults. `on_event` is told each
    check's start and result, and each learner call a running check makes ({"event": "calling", "check",
    "target", "inputs"}), as they happen. `compile_cache`: a
    folder where the learner's Triton kernels stay compiled between grades (a GPU grade of week 9 spends
    most of a cold grade compiling); without it every grade compiles afresh. `checks`: grade only these check
    ids and what they need (grading.selection); the result is then partial and never completes the week."""
    lab = week_ref if isinstance(week_ref, LabDir) else course.lab(week_ref)
    hardware = hardware or detect()
    graded = lab.spec.checks if checks is None else \
        [lab.spec.check(i) for i in with_prerequisites(lab.spec, checks, blocked=lambda c: hardware.missing(c.needs))]
    only = None if len(graded) == len(lab.spec.checks) else {c.id for c in graded}
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S")
    t0 = time.perf_counter()
    settled: dict[str, CheckResult] = {}
    for check in graded:
        reason = hardware.missing(check.needs)
        if reason:
            settled[check.id] = _result(check, "blocked", reason)
            if on_event:
                on_event({"event": "result", "check": check.id, "status": "blocked"})
    # Everything of this grade lives in `work` (the judge's TMPDIR and pytest's basetemp too: the worker's scratch,
    # its log, a server's or a launch's): removed when the grade ends, a check times out, or Ctrl-C stops it.
    with tempfile.TemporaryDirectory(prefix=f"infracourse-{lab.spec.week}-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        snapshot = work / "learner"
        shutil.copytree(files_dir, snapshot, ignore=IGNORED, symlinks=True)
        (work / "pytest.ini").write_text("[pytest]\n")  # keeps the project's own pytest settings out
        env = _grader_env(hardware, files_dir)
        env.update(kit_access.environment(lab.spec.kit, lab.graders))  # every sandbox of it: this week's kit only
        env["TMPDIR"] = str(work / "tmp")
        env[hangs.SCALE_ENV] = str(timeout_scale)  # a launch in the judge ends before its check's limit
        (work / "tmp").mkdir()
        if compile_cache is not None:
            compile_cache.mkdir(parents=True, exist_ok=True)
            env[COMPILE_CACHE_ENV] = str(compile_cache.resolve())
        session = GradeSession(lab=lab, work=work, snapshot=snapshot, env=env, settled=settled, on_event=on_event,
                               timeout_scale=timeout_scale, only=only)
        log_tail = ""
        for attempt in range(len(graded) + 1):
            if all(c.id in settled for c in graded):
                break
            newly, log_tail = _run_judge(session, attempt)
            settled.update(newly)
            if not newly:
                break  # the process settled nothing: a grader or collection error; stop retrying
        for check in graded:
            if check.id not in settled:
                settled[check.id] = _result(check, "error", "the grader produced no result for this check "
                                            f"(grader output, last lines:\n{_tail(log_tail)})")
    _withhold_unearned_credit(graded, settled)
    return GradeResult(week=lab.spec.week, tier=hardware.tier, device=hardware.device_name,
                       fingerprint=hardware.fingerprint(), started_at=started_at,
                       seconds=time.perf_counter() - t0, checks=[settled[c.id] for c in graded],
                       grader_version=__version__, sandboxed=sandbox.status().available, partial=only is not None)


def _withhold_unearned_credit(graded, settled: dict[str, CheckResult]) -> None:
    """A check with `requires` keeps a pass only if every check it requires passed in this grade."""
    for check in graded:
        result = settled[check.id]
        if result.status in ("blocked", "error"):
            continue  # kept as it is (a blocked check's requires are not graded in a partial grade: selection)
        unmet = [r for r in check.requires if settled[r].status != "passed"]
        if unmet:
            states = ", ".join(f"{r}: {settled[r].status}" for r in unmet)
            message = result.message if result.status == "failed" and result.message.startswith("no credit") else \
                f"no credit yet: {', '.join(unmet)} must pass in the same run first ({states})"
            settled[check.id] = _result(check, "failed", message, result.figures, result.seconds)


def _grader_env(hardware: Hardware, files_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only our plugin: third-party ones must not alter grading
    env.setdefault("INFRACOURSE_SEED", str(random.SystemRandom().randrange(2**31)))
    env["INFRACOURSE_ARTIFACTS"] = str(files_dir.resolve() / ".grade")  # plots the report links to
    if hardware.gpu_count == 0:
        env["TRITON_INTERPRET"] = "1"  # Triton kernels run on the CPU through the interpreter
    return env


def _result(check, status: str, message: str, figures: dict | None = None, seconds: float = 0.0) -> CheckResult:
    return CheckResult(id=check.id, title=check.title, kind=check.kind, needs=check.needs, status=status,
                       message=message, figures=figures or {}, seconds=seconds)


@dataclass
class GradeSession:
    """What every judge process of one grade shares, kept by the runner: the lab and its parsed spec, the grade's
    private folder (`work`) and the learner's snapshot in it, the judges' environment, and what this grade has
    settled so far: check results (with their figures) and the learner functions that hung."""
    lab: LabDir
    work: Path
    snapshot: Path
    env: dict[str, str]
    settled: dict[str, CheckResult]
    on_event: EventHandler | None = None
    timeout_scale: float = 1.0
    only: set[str] | None = None  # a partial grade's check ids (and what they require); None: every check
    hung: set[str] = field(default_factory=set)  # learner functions that overran a limit: not called again

    @property
    def interpreted(self) -> bool:
        """Triton kernels run in its interpreter here (no GPU): each learner call gets its own limit."""
        return self.env.get("TRITON_INTERPRET") == "1"

    def tell(self, event: dict) -> None:
        if self.on_event:
            self.on_event(event)


@dataclass
class JudgeRun:
    """The runner's view of one judge process: what it started, what it settled, what is running now."""
    known: set[str]
    newly: dict[str, CheckResult] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)
    calling: dict[str, dict] = field(default_factory=dict)  # check -> the calling event of its last learner call
    running: tuple[str, float] | None = None  # (check id, monotonic time its limit counts from)


def _run_judge(session: GradeSession, attempt: int) -> tuple[dict[str, CheckResult], str]:
    """Run one judge process over the checks not yet settled; returns what it settled and its log's tail."""
    lab, work = session.lab, session.work
    spec_path = work / "lab.json"  # the parsed lab.yaml, for the judge: afresh for every judge process
    spec_path.write_text(lab.spec.model_dump_json(), encoding="utf-8")
    settled_path = work / "settled.json"  # what earlier judges of this grade settled, figures included
    write_settled(settled_path, {k: (r.status, {n: f.as_dict() for n, f in r.figures.items()})
                                 for k, r in session.settled.items()})
    log_path = work / f"judge-{attempt}.log"
    read_fd, write_fd = os.pipe()
    arguments = [str(lab.graders), "-p", "infracourse.grading.plugin",
               "-c", str(work / "pytest.ini"), "--rootdir", str(lab.graders), "--import-mode=importlib",
                 "--confcutdir", str(lab.graders),  # the week's conftest.py files only, none of a folder above
               "-q", "--no-header", "-p", "no:cacheprovider", "--basetemp", str(work / "pt"),
               "--infracourse-lab", str(lab.path / "lab.yaml"), "--infracourse-spec", str(spec_path),
               "--infracourse-learner", str(session.snapshot),
               "--infracourse-events-fd", str(write_fd),
               "--infracourse-settled", str(settled_path),
               "--infracourse-hung", ",".join(sorted(session.hung)),
               "--infracourse-only", ",".join(sorted(session.only or ()))]
    judge = JudgeRun(known={c.id for c in lab.spec.checks})
    kernels_interpreted = session.interpreted and _uses_triton(session.snapshot)  # a hang's message: tiles then
    buffer = b""
    with log_path.open("wb") as log:
        try:
            proc = judges.start(arguments, cwd=work, env=session.env, log_fd=log.fileno(), events_fd=write_fd)
        finally:
            os.close(write_fd)
        try:
            open_pipe = True
            while open_pipe:
                ready, _, _ = select.select([read_fd], [], [], POLL_S)
                if ready:
                    chunk = os.read(read_fd, 1 << 16)
                    open_pipe = bool(chunk)
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        _accept(line, session, judge)
                if judge.running and _overran_limit(session, judge, kernels_interpreted):
                    _kill(proc)
                    break
        except BaseException:
            _kill(proc)  # Ctrl-C: never leave a grader running behind the learner's back
            raise
        finally:
            os.close(read_fd)
        proc.wait()
    if judge.running and judge.running[0] not in judge.newly:
        _settle(session, judge, "error", f"the grading process died during this check: "
                f"{_signal_name(proc.returncode)}; the other checks went on")
    return judge.newly, read_tail(log_path)


def _overran_limit(session: GradeSession, judge: JudgeRun, kernels_interpreted: bool) -> bool:
    """Whether the running check overran its limit: then it is settled as an `error` naming the call that hung,
    and that function is remembered as hung for the next judge."""
    check = session.lab.spec.check(judge.running[0])
    call = judge.calling.get(check.id, {})
    limit = call_limit(check.timeout_s * session.timeout_scale, call, session.interpreted)
    if time.monotonic() - judge.running[1] <= limit:
        return False
    if call.get("target"):
        session.hung.add(call["target"])
    _settle(session, judge, "error", _overran(limit, call, kernels_interpreted))
    return True


def _settle(session: GradeSession, judge: JudgeRun, status: str, message: str) -> None:
    """The runner's own verdict on the running check (it overran, or its judge died)."""
    check = session.lab.spec.check(judge.running[0])
    judge.newly[check.id] = _result(check, status, message)
    judge.running = None
    session.tell({"event": "result", "check": check.id, "status": status})


def call_limit(limit: float, call: dict, interpreted: bool) -> float:
    """The seconds a check may run since its start or, under the Triton interpreter, since its last learner
    call began: there the limit grows with that call's input (INTERPRETER_S_PER_ELEMENT)."""
    return limit + (INTERPRETER_S_PER_ELEMENT * call.get("elements", 0) if interpreted else 0.0)


def _uses_triton(snapshot: Path) -> bool:
    """Whether the learner's Python files use Triton (read as text: the runner never imports them)."""
    return any("triton" in path.read_text(errors="replace") for path in snapshot.rglob("*.py"))


def _overran(limit: float, call: dict, interpreted: bool) -> str:
    """Why a check was stopped: the call that overran, its input, and what is slow where."""
    function = call.get("target")
    if not function:
        return (f"took longer than {limit:.0f} s and was stopped: an infinite loop, a deadlock, or work far too slow "
                "for this check")
    inputs = f" on {call['inputs']}" if call.get("inputs") else ""
    message = (f"took longer than {limit:.0f} s inside {function}(){inputs} and was stopped: an infinite loop, a "
               f"deadlock, or work far too slow for this check; {function}() is not called again in this grade")
    if interpreted:
        message += (". No GPU here: Triton kernels run in its interpreter, where every program instance is Python "
                    "(about 10 ms each, whatever its tile), so a grid of many small tiles is slow for this input "
                    "even when correct. Use larger tiles (1024 elements or more per program; on a 1-row input, "
                    "tiles one row high) or fewer programs, each looping over its share")
    return message


def _accept(line: bytes, session: GradeSession, judge: JudgeRun) -> None:
    """Take one event line of `judge` if the contract allows it (judge.running: the check running after it)."""
    try:
        event = validate_event(json.loads(line), judge.known)
    except (ValueError, ProtocolError):
        return  # not an event of ours: ignored (it can neither start nor settle a check)
    check = session.lab.spec.check(event["check"])
    if check.id in session.settled or check.id in judge.newly:
        return  # settled already (blocked here, or reported once): never overwritten
    running = judge.running is not None and judge.running[0] == check.id
    if event["event"] == "calling":
        if running:
            judge.calling[check.id] = event
            if session.interpreted:  # each call gets its own limit there (call_limit)
                judge.running = (check.id, time.monotonic())
            session.tell(event)  # what the running check is calling now (a progress display; a grade's timeline)
        return
    if event["event"] == "start":
        judge.started.add(check.id)
        judge.running = (check.id, time.monotonic())
    elif check.id in judge.started and running:
        status, message = event["status"], str(event.get("message", ""))[:4000]
        try:
            figures = figures_of(event.get("figures") or {})
        except FigureError as exc:  # the judge recorded what no Figure is: the check cannot stand on it
            status, figures = "error", {}
            message = f"the grader sent a malformed figure ({exc}); this is a course bug, please report it"
        judge.newly[check.id] = _result(check, status, message, figures, float(event.get("duration") or 0.0))
        event = event | {"status": status}
        judge.running = None
    else:
        return  # a result without its own start first
    session.tell(event)


def _tail(log: str, lines: int = 12) -> str:
    return "\n".join(log.strip().splitlines()[-lines:]) or "none"


def _kill(proc: judges.Judge) -> None:
    group.kill_group(proc.pid)
    proc.wait()
