"""pytest plugin that turns grader tests into course checks: the judge's side of grading.protocol.

Loaded by the runner (`-p infracourse.grading.plugin`) in the judge process, which never imports learner
code (the `learner` fixture reaches it through a sandboxed worker). Settings come from command-line options
only, all set by the runner:
  --infracourse-lab        path of the week's lab.yaml (its folder holds the starter templates); not read here
  --infracourse-spec       that lab.yaml as the runner parsed it (JSON, in the runner's private temporary folder):
                           check ids, needs, requires, thresholds. lab.yaml is parsed once per grade, by the runner
  --infracourse-learner    folder holding the snapshot of the learner's files
  --infracourse-events-fd  inherited pipe: a `start` line before and a `result` line after every check
  --infracourse-settled    settled.json (grading.protocol): checks already settled (blocked here, or by an earlier
                           judge process of this grade): not run again; their statuses count for `requires`, their
                           figures for the report check
  --infracourse-only       check ids, comma-separated, of a partial grade (grading.selection): the others are not
                           run; empty: every check
A grader test names its check with `@pytest.mark.check("id")`; grading.fixtures gives it the learner's
code, the hardware, the calibrated ceilings and `record` for measured figures. The runner, not this plugin,
has the last word on `blocked`, `requires` and completion.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from infracourse.grading.fixtures import CHECK_KEY
from infracourse.grading.protocol import FATAL_EXIT, read_settled
from infracourse.grading.remote import LearnerHung, LearnerRaised, WorkerFailed
from infracourse.grading.results import Figure, figures_of
from infracourse.guard import LabCheckFailed, WrongOutput
from infracourse.syllabus import Lab

BLOCKED_PREFIX = "infracourse-blocked: "
# Errors after which the CUDA context is unusable: the runner restarts a fresh process for the rest.
FATAL_MARKERS = ("illegal memory access", "CUDA error", "device-side assert", "unspecified launch failure")


def pytest_addoption(parser):
    group = parser.getgroup("infracourse")
    group.addoption("--infracourse-lab", help="lab.yaml of the week being graded")
    group.addoption("--infracourse-spec", help="that lab.yaml as the runner parsed it, as JSON")
    group.addoption("--infracourse-learner", help="folder with the snapshot of the learner's files")
    group.addoption("--infracourse-events-fd", type=int, help="inherited pipe for JSON-lines check events")
    group.addoption("--infracourse-settled", default="", help="settled.json: the checks already settled")
    group.addoption("--infracourse-hung", default="", help="learner functions that overran a limit, comma-separated")
    group.addoption("--infracourse-only", default="", help="check ids of a partial grade, comma-separated")


def pytest_configure(config):
    config.addinivalue_line("markers", "check(id): the course check this test decides (an id from lab.yaml)")
    config.addinivalue_line("markers", "timing: a check decided by a measured time; measured again before failing")
    lab_path = config.getoption("--infracourse-lab")
    if not lab_path:
        return
    config._infracourse = _Session(config)
    config.pluginmanager.register(config._infracourse, "infracourse-session")


class _Session:
    def __init__(self, config):
        self.lab = _spec(config)
        self.learner_dir = Path(config.getoption("--infracourse-learner")).resolve()
        self.events_fd = config.getoption("--infracourse-events-fd")
        settled_path = config.getoption("--infracourse-settled")
        settled = read_settled(Path(settled_path)) if settled_path else {}
        self.statuses: dict[str, str] = {check: status for check, (status, _) in settled.items()}
        self.skip = set(self.statuses)
        self.only = {i for i in config.getoption("--infracourse-only").split(",") if i}  # empty: every check
        # check id -> the figures it recorded in this grade (this process's, and those of the judges before it)
        self.figures: dict[str, dict[str, Figure]] = {check: figures_of(f) for check, (_, f) in settled.items()}
        self.worker = None  # started by the `learner` fixture on first use
        self.hung = {name for name in config.getoption("--infracourse-hung").split(",") if name}
        self.current: str | None = None  # the check running now

    def emit(self, **event) -> None:
        line = (json.dumps(event, default=str) + "\n").encode()
        if self.events_fd is not None:
            os.write(self.events_fd, line)  # one write per event: the runner reads whole lines

    def pytest_unconfigure(self, config):
        if self.worker is not None:
            self.worker.close()

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        known = {c.id: c for c in self.lab.checks}
        keep, deselected, owner = [], [], {}
        for item in items:
            marker = item.get_closest_marker("check")
            if marker is not None and marker.args and marker.args[0] in self.lab.later:
                deselected.append(item)  # a track project's check that a later project week grades
                continue
            if marker is None or not marker.args or marker.args[0] not in known:
                name = marker.args[0] if marker and marker.args else None
                raise pytest.UsageError(f"{item.nodeid}: grader test names check {name!r}, which lab.yaml does not "
                                        f"define (known: {sorted(known)})")
            if marker.args[0] in owner:  # the runner keeps a check's first verdict: a second test could not fail it
                raise pytest.UsageError(f"{item.nodeid} and {owner[marker.args[0]]} both decide check "
                                        f"{marker.args[0]!r}: one test per check (give each parameter its own check "
                                        "id, or loop inside one test)")
            owner[marker.args[0]] = item.nodeid
            item.stash[CHECK_KEY] = marker.args[0]
            unselected = self.only and marker.args[0] not in self.only
            (deselected if marker.args[0] in self.skip or unselected else keep).append(item)
        # checks that need others' results in this run (performance after correctness) go last, and the report,
        # whose figures are compared with what the other checks measured, after them
        keep.sort(key=lambda it: (known[it.stash[CHECK_KEY]].kind == "report",
                                  bool(known[it.stash[CHECK_KEY]].requires)))
        items[:] = keep
        if deselected:
            config.hook.pytest_deselected(items=deselected)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        """A check decided by a time (kind performance, or marked `timing`) is measured a second time before it
        fails: one unlucky moment on a busy machine must not fail honest code. The second verdict stands."""
        check = self.lab.check(pyfuncitem.stash[CHECK_KEY])
        if check.kind != "performance" and pyfuncitem.get_closest_marker("timing") is None:
            return None  # pytest calls the test as usual
        arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        try:
            pyfuncitem.obj(**arguments)
        except WrongOutput:
            raise
        except LabCheckFailed:
            try:
                pyfuncitem.obj(**arguments)
            except LabCheckFailed as again:
                raise LabCheckFailed(f"{again} (measured twice, both times short{_busy_note()})") from None
        return True

    def pytest_runtest_setup(self, item):
        check = self.lab.check(item.stash[CHECK_KEY])
        if self.worker is not None:
            try:
                self.worker.ready()  # a worker an earlier check killed is replaced before this check's clock starts
            except WorkerFailed:
                pass  # the check's own first call says what happened
        self.current = check.id
        self.emit(event="start", check=check.id, t=time.time())
        unmet = [r for r in check.requires if self.statuses.get(r) != "passed"]
        if unmet:
            states = ", ".join(f"{r}: {self.statuses.get(r, 'not run')}" for r in unmet)
            pytest.fail(f"no credit yet: {', '.join(unmet)} must pass in the same run first ({states})",
                        pytrace=False)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        check_id = item.stash.get(CHECK_KEY, None)
        if check_id is None or item.stash.get(_DONE, False):
            return
        if call.when == "setup" and report.passed:
            return
        if call.when == "teardown" and not report.failed:
            return
        status, message, fatal = classify(call, report)
        item.stash[_DONE] = True
        self.statuses[check_id] = status
        figures = getattr(item, "_infracourse_figures", {})
        self.figures[check_id] = figures  # what this check measured, for the report check (grading.report_check)
        self.emit(event="result", check=check_id, status=status, message=message, t=time.time(),
                  figures={name: figure.as_dict() for name, figure in figures.items()}, duration=report.duration)
        if fatal:
            os._exit(FATAL_EXIT)  # the device is unusable after this; the runner goes on in a fresh process


_DONE = pytest.StashKey[bool]()


def _spec(config) -> Lab:
    """The lab spec the runner parsed (never lab.yaml itself: one parse per grade, in the runner)."""
    path = config.getoption("--infracourse-spec")
    if not path:
        raise pytest.UsageError("--infracourse-spec is missing: graders run through `infracourse grade`, which "
                                "passes the lab spec it parsed")
    return Lab.model_validate_json(Path(path).read_bytes())


def _busy_note() -> str:
    """'; this machine was busy: ...' when the CPU load exceeds its cores (other work competed for the time)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cores = os.cpu_count() or 1
    return f"; this machine was busy: load average {load:.1f} on {cores} cores" if load > cores else ""


def classify(call, report) -> tuple[str, str, bool]:
    """Map a pytest phase outcome to (status, message, fatal)."""
    if report.skipped:
        reason = str(call.excinfo.value) if call.excinfo else ""
        if BLOCKED_PREFIX in reason:
            return "blocked", reason.split(BLOCKED_PREFIX, 1)[1], False
        return "error", f"the grader skipped this check unexpectedly: {reason}", False
    if report.passed:
        return "passed", "", False
    exc = call.excinfo.value if call.excinfo else None
    if isinstance(exc, LearnerRaised):
        if exc.type_name == "LearnerImportError":
            return "error", exc.message, False
        if exc.type_name == "NotImplementedError":
            return "failed", f"not written yet: {exc.message}", False
        if exc.type_name == "OutOfMemoryError":
            return "error", f"ran out of device memory: {exc.message}", False
        return "error", f"raised {str(exc)[:800]}", False
    if isinstance(exc, LearnerHung):
        return "error", str(exc), False
    if isinstance(exc, WorkerFailed):
        return "error", str(exc)[:1500], False
    if isinstance(exc, (AssertionError, pytest.fail.Exception)):
        text = str(exc) if isinstance(exc, LabCheckFailed) or not str(exc).startswith("assert") else _short(call)
        return "failed", text.strip(), False
    text = f"{type(exc).__name__}: {exc}"
    fatal = any(m in text for m in FATAL_MARKERS)
    if type(exc).__name__ == "OutOfMemoryError":
        text = f"ran out of device memory: {exc}"
    return "error", f"raised {_clip(text.strip(), 1500)}", fatal


def _clip(text: str, limit: int) -> str:
    """At most `limit` characters, keeping the head (what raised) and the tail (a crashed child's traceback
    ends with its cause)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]}\n[... {len(text) - limit} characters left out ...]\n{text[-(limit - head):]}"


def _short(call) -> str:
    return str(call.excinfo.getrepr(style="short", chain=False))[-800:]


pytest_plugins = ["infracourse.grading.fixtures"]
