"""The start self-test (003 §1): can you write a training loop and resume it, explain a tensor's shape,
stride, dtype and device, and tell data waiting from transfer from compute? A few minutes of questions
from `curriculum/drills/selftest.yaml`, each probing one early week; the result says which of those weeks to
do first and which you may skip, is stored in progress, and `infracourse status` shows it.
"""
from __future__ import annotations

from infracourse.drills.session import Sitting

PASS_SHARE = 1.0  # a week may be skipped only when every one of its questions was right


def suggestion(sitting: Sitting) -> dict:
    """{"by_week": {week: [right, asked]}, "do_first": [...], "may_skip": [...]}"""
    by_week = sitting.tally(lambda question: question.week)
    may_skip = [w for w, (right, asked) in by_week.items() if asked and right / asked >= PASS_SHARE]
    return {"by_week": by_week, "do_first": [w for w in by_week if w not in may_skip], "may_skip": may_skip,
            "complete": not sitting.unanswered}


def summary_line(result: dict | None) -> str:
    """One line for `status`: the suggestion of the last self-test, or how to take one."""
    if result is None:
        return "start self-test not taken: `infracourse selftest` (a few minutes) says which early weeks to do first"
    first = ", ".join(result["do_first"]) or "none"
    skip = ", ".join(result["may_skip"]) or "none"
    partial = "" if result.get("complete", True) else " (not finished)"
    return f"self-test {result['taken_at'][:10]}{partial}: do first {first}; you may skip {skip}"
