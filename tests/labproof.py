"""What a lab's proof asserts, for the tests/test_weekNN.py that use it: the solution completes the week on
this machine within the time budget, and a wrong variant fails the check meant to catch it."""
from __future__ import annotations

GRADE_BUDGET_S = 60  # a week grades in under a minute on a 2-core CPU


def assert_solution_passes(grade_lab, machine, week: str) -> dict:
    result, checks = grade_lab(week)
    assert result.complete, {c.id: (c.status, c.message) for c in result.checks if c.status != "passed"}
    for check in checks.values():
        expected = "passed" if machine.satisfies(check.needs) else "blocked"
        assert check.status == expected, (check.id, check.message)
    assert result.seconds < GRADE_BUDGET_S, f"{week} graded in {result.seconds:.0f} s"
    return checks


def assert_variant_fails(grade_lab, week: str, check_id: str, edits: dict) -> None:
    result, checks = grade_lab(week, edits=edits)
    assert checks[check_id].status == "failed", (checks[check_id].status, checks[check_id].message)
    assert not result.complete
