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
code, the hardware, the calibrated ceilings and `record` for measured figures. The checks labs share (the
report, a project's five) are not grader files: this plugin collects them from the package, as lab.yaml asks
(grading.shared), beside the week's own grader files. The runner, not this plugin, has the last word on
`blocked`, `requires` and completion.
"""
from __future__ import annotations

import bisect
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import pytest

from infracourse.failures import LabCheckFailed, WrongOutput
from infracourse.grading.fixtures import CHECK_KEY
from infracourse.grading.protocol import FATAL_EXIT, read_settled
from infracourse.grading.remote import LearnerHung, LearnerRaised, WorkerFailed
from infracourse.grading.results import Figure, figures_of
from infracourse.grading.shared import SORTS_AS, shared_module
from infracourse.hardware import cpu_contention
from infracourse.launch import hangs
from infracourse.syllabus import Lab

BLOCKED_PREFIX = "infracourse-blocked: "


def blocked(why: str) -> NoReturn:
    """End this check as `blocked`: this machine cannot run it (no GPU, no compiler), which is no failure of the
    learner's. `why` says what is missing and how to get it."""
    pytest.skip(BLOCKED_PREFIX + why)


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
    if "OMP_NUM_THREADS" not in os.environ:  # as the processes it starts (ONE_THREAD in infracourse.launch)
        import torch

        torch.set_num_threads(1)
    config._infracourse = _Session(config)
    config.pluginmanager.register(config._infracourse, "infracourse-session")


def pytest_load_initial_conftests(early_config, parser, args):
    """A week's shared judging module (graders/week17/week17_judging.py) is imported by its week-unique name, by
    the week's conftest.py too: the graders' folder (the rootdir) goes on the judge's path before that loads."""
    sys.path.insert(0, str(early_config.rootpath))


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
        self.shared = shared_module(self.lab)  # the shared checks lab.yaml asks for (grading.shared), or None
        self.shared_collected = False
        hangs.connect(lambda target, inputs: self.emit(event="calling", check=self.current, target=target,
                                                      inputs=inputs, elements=0), self.hung)

    def emit(self, **event) -> None:
        if event["event"] == "calling":
            hangs.call_began()
        line = (json.dumps(event, default=str) + "\n").encode()
        if self.events_fd is not None:
            os.write(self.events_fd, line)  # one write per event: the runner reads whole lines

    def pytest_unconfigure(self, config):
        if self.worker is not None:
            self.worker.close()

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        """The graders' folder (the root the runner names) yields its own files and, at the place their grader file
        sorted before they moved into the package, the shared checks lab.yaml asks for."""
        report = yield
        if (self.shared is None or not report.passed or not isinstance(collector, pytest.Directory)
                or collector.path != collector.config.rootpath):
            return report
        node = _SharedChecks.from_parent(collector, path=Path(self.shared.__file__), name=self.shared.__name__,
                                         nodeid=self.shared.__name__)
        report.result.insert(bisect.bisect([n.name for n in report.result], SORTS_AS[self.shared]), node)
        self.shared_collected = True
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        if self.shared is not None and not self.shared_collected:
            raise pytest.UsageError(f"the shared checks of {self.shared.__name__} were not collected: the graders' "
                                    "folder must be pytest's rootdir and its argument (`infracourse grade` runs it so)")
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
        hangs.checking(check.id, check.timeout_s)  # a launch that hangs now names this check (launch.hangs)
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


class _SharedChecks(pytest.Module):
    """The shared checks' module (grading.shared), collected as the package imported it: the same module object
    (and state) the rest of the judge sees, never a second copy imported from its file path."""

    def _getobj(self):
        return importlib.import_module(self.name)


def _spec(config) -> Lab:
    """The lab spec the runner parsed (never lab.yaml itself: one parse per grade, in the runner)."""
    path = config.getoption("--infracourse-spec")
    if not path:
        raise pytest.UsageError("--infracourse-spec is missing: graders run through `infracourse grade`, which "
                                "passes the lab spec it parsed")
    return Lab.model_validate_json(Path(path).read_bytes())


def _busy_note() -> str:
    """'; this machine was busy: ...' when the CPU load exceeds its cores (other work competed for the time)."""
    contention, cores = cpu_contention(), os.cpu_count() or 1
    return (f"; this machine was busy: load average {contention * cores:.1f} on {cores} cores" if contention > 1
            else "")


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
