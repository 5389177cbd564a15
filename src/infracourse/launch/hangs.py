"""Launches that overran their time limit in this grade: the next launch of the same code is not started.

A worker call that never returns is paid once per grade (grading.remote.LearnerHung). A launched program (a
torchrun world whose collective never completes) runs outside the worker, so the launcher (grading.torchrun)
keeps the same promise through this module, in two ways:

- in the judge process: a launch killed at its own limit is noted (`note`), and a later launch of the same
  code (`earlier`) is refused, naming the check during which it hung. So that the launch, not the runner, is
  the one to stop it, its limit never reaches past its check's (`limit`: the check's time left, less a margin);
- across judge processes: each launch is announced to the runner as a learner call (`starting`: a "calling"
  event, grading.protocol). Where the runner kills the judge at the check's limit anyway, it remembers the
  launch as hung and the next judge is told (`connect`), as for a worker function.

The grading plugin is the only caller of `connect` and `checking`: this module knows nothing of pytest.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

# For the engine's own tests only: caps every launch's time limit (seconds), so that a test of a deadlocking
# world waits a few seconds instead of the grader's two minutes. A grade never sets it.
TEST_LIMIT_ENV = "INFRACOURSE_TEST_LAUNCH_LIMIT_S"
# The runner's scale of every check's time limit (runner.grade's timeout_scale), passed to the judge.
SCALE_ENV = "INFRACOURSE_TIMEOUT_SCALE"
MARGIN_S = 5.0  # a launch stops this long before its check's limit: the judge then still reports the check


@dataclass(frozen=True)
class Hang:
    what: str               # the code that was launched ("infracourse.kit.collectives.grade_rank")
    check: str | None       # the check during which it hung; None when an earlier judge process saw it
    seconds: float | None   # the limit it overran; None when the runner stopped it at its check's limit
    verb: str = "did not finish"  # what it failed to do within `seconds` ("did not answer": a server)

    def described(self) -> str:
        if self.seconds is None:
            return f"{self.what} overran an earlier check's time limit in this grade"
        return f"{self.what} {self.verb} within {self.seconds:.0f} s" + (f" in check {self.check!r}"
                                                                           if self.check else " earlier")


@dataclass
class _Grade:
    announce: Callable[[str, str], None] | None = None  # tells the runner of a launch (target, inputs)
    hung: frozenset[str] = frozenset()    # targets an earlier judge process of this grade saw hang
    check: str | None = None              # the check now running
    deadline: float | None = None         # when the runner stops it (time.monotonic), as far as the judge knows
    check_limit_s: float = 0.0


_grade = _Grade()
_hangs: dict[tuple, Hang] = {}


def connect(announce: Callable[[str, str], None], hung: set[str]) -> None:
    """The grading plugin's hook, once per judge process: how to announce a launch, and what hung before."""
    _grade.announce, _grade.hung = announce, frozenset(hung)


def checking(check: str, limit_s: float) -> None:
    """The check now running and its time limit in the runner (scaled as the runner scales it)."""
    _grade.check, _grade.check_limit_s = check, limit_s * _scale()
    _grade.deadline = time.monotonic() + _grade.check_limit_s


def starting(target: str, inputs: str = "") -> None:
    """A launch of `target` begins: the runner is told, as of a learner call (through the plugin, which then
    calls `call_began`)."""
    if _grade.announce is not None:
        _grade.announce(target, inputs)


def call_began() -> None:
    """A learner call (a worker call or a launch) was announced to the runner. Under the Triton interpreter (no
    GPU) the runner gives each call its check's whole limit afresh (runner.call_limit), and so does this
    module's deadline."""
    if _grade.deadline is not None and os.environ.get("TRITON_INTERPRET") == "1":
        _grade.deadline = time.monotonic() + _grade.check_limit_s


def limit(timeout_s: float) -> float:
    """A launch's time limit: `timeout_s`, cut to end MARGIN_S before its check's (at least 1 s), and capped
    where the engine's tests set TEST_LIMIT_ENV."""
    if _grade.deadline is not None:
        timeout_s = min(timeout_s, max(1.0, _grade.deadline - time.monotonic() - MARGIN_S))
    try:
        return min(timeout_s, float(os.environ.get(TEST_LIMIT_ENV) or "inf"))
    except ValueError:
        return timeout_s


def note(key: tuple, what: str, seconds: float, verb: str = "did not finish") -> Hang:
    """Remember that the launch of `key` (the learner's folder and what was launched) overran `seconds`."""
    return _hangs.setdefault(key, Hang(what, _grade.check, seconds, verb))


def earlier(key: tuple, target: str) -> Hang | None:
    """Why a launch of `key` must not start: an earlier launch of it hung in this judge process, or `target`
    hung in an earlier one of this grade. None when it may start."""
    if key in _hangs:
        return _hangs[key]
    return Hang(target, None, None) if target in _grade.hung else None


def forget() -> None:
    """A fresh grade in the same process (the engine's tests)."""
    global _grade
    _hangs.clear()
    _grade = _Grade()


def _scale() -> float:
    try:
        return float(os.environ.get(SCALE_ENV) or 1.0)
    except ValueError:
        return 1.0
