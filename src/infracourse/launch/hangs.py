"""Launches that overran their time limit in this grade: the next launch of the same code is not started.

A worker call that never returns is paid once per grade (grading.remote.LearnerHung). A launched program (a
torchrun world whose collective never completes) runs outside the worker, so it is remembered here instead:
the judge process lives for the whole grade, and the launcher (grading.torchrun) notes each launch that it
killed at its limit and refuses a later launch of the same learner code, naming the check during which it hung.

The grading plugin tells this module which check is running (`checking`), which is all it knows of pytest.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

# For the engine's own tests only: caps every launch's time limit (seconds), so that a test of a deadlocking
# world waits a few seconds instead of the grader's two minutes. A grade never sets it.
TEST_LIMIT_ENV = "INFRACOURSE_TEST_LAUNCH_LIMIT_S"


@dataclass(frozen=True)
class Hang:
    what: str            # the code that was launched, as the learner knows it ("collectives.grade_rank")
    check: str | None    # the check that was running when it hung (None outside a grade)
    seconds: float       # the limit it overran

    def during(self) -> str:
        return f"check {self.check!r}" if self.check else "an earlier check"


_current: list[str | None] = [None]
_hangs: dict[tuple, Hang] = {}


def checking(check: str | None) -> None:
    """The check now running in this judge process (the grading plugin calls this as each check starts)."""
    _current[0] = check


def limit(timeout_s: float) -> float:
    """A launch's time limit: `timeout_s`, or less where the engine's tests cap it (TEST_LIMIT_ENV)."""
    cap = os.environ.get(TEST_LIMIT_ENV, "")
    try:
        return min(timeout_s, float(cap)) if cap else timeout_s
    except ValueError:
        return timeout_s


def note(key: tuple, what: str, seconds: float) -> Hang:
    """Remember that the launch of `key` (what identifies the learner code it ran) overran `seconds`."""
    return _hangs.setdefault(key, Hang(what, _current[0], seconds))


def earlier(key: tuple) -> Hang | None:
    """The hang of an earlier launch of `key` in this grade, or None."""
    return _hangs.get(key)


def forget() -> None:
    """Forget every hang (a new grade in the same process: the engine's tests)."""
    _hangs.clear()
    _current[0] = None
