"""What a lab's proof asserts, for the tests/test_weekNN.py that use it: the solution completes the week on
this machine, and a wrong variant fails the check meant to catch it. (Grading time is a target measured in
docs/grading-times.md, not a timed assertion: a loaded CI machine must not turn it into a flaky failure.)"""
from __future__ import annotations

import re
from pathlib import Path


def assert_solution_passes(grade_lab, machine, week: str, edits: dict | None = None, track: str | None = None) -> dict:
    """The solution (or, with `edits`, an honest variant of it) completes the week: every check passed or,
    where this machine lacks the hardware, blocked. A project week (22-24) grades `track`'s project."""
    result, checks = grade_lab(week, edits=edits, track=track)
    assert result.complete, {c.id: (c.status, c.message) for c in result.checks if c.status != "passed"}
    for check in checks.values():
        expected = "passed" if machine.satisfies(check.needs) else "blocked"
        assert check.status == expected, (check.id, check.message)
    return checks


def not_passed(checks: dict) -> dict:
    """Every check of a grade that neither passed nor was blocked, with its message: what a failed proof shows,
    since a check withheld for another it requires names only that one ("no credit yet: cost-model ...")."""
    return {k: (c.status, c.message) for k, c in checks.items() if c.status not in ("passed", "blocked")}


def assert_variant_fails(grade_lab, week: str, check_id: str | tuple[str, ...], edits: dict, track: str | None = None,
                         only: bool = False):
    """The variant fails `check_id` (or each of a tuple of them; the first is returned, for its message). Only
    those checks and what they require are graded (as `infracourse grade --check`), so its verdict is a whole
    grade's in a fraction of the time; the solution's proof grades the whole week. `only`: every other check of
    that partial grade (what the targets require) passed or was blocked, so the variant breaks what it is aimed
    at and nothing upstream of it."""
    targets = (check_id,) if isinstance(check_id, str) else tuple(check_id)
    result, checks = grade_lab(week, edits=edits, track=track, checks=list(targets))
    for target in targets:
        assert checks[target].status == "failed", (target, checks[target].status, checks[target].message)
    if only:
        others = {k: v for k, v in not_passed(checks).items() if k not in targets}
        assert not others, others
    assert not result.complete
    return checks[targets[0]]


FIXTURES = Path(__file__).parent / "fixtures"
ENVIRONMENT = re.compile(r"^## Environment\n.*?(?=^## )", re.MULTILINE | re.DOTALL)


def with_stamped_environment(report: str):
    """An edit: `report` with the Environment section grade_lab stamped into the lab's own report (this machine);
    a report written elsewhere names that machine, which the report check refuses here."""
    return lambda stamped: ENVIRONMENT.sub(lambda _: ENVIRONMENT.search(stamped).group(0), report, count=1)


def handout_solution(week: str) -> dict:
    """Edits replacing the solution's files with tests/fixtures/<week>-handout/: a solution written by someone who
    read only the handout, the starter, lab.yaml and the kit modules it names, never the reference (issue 29).
    Its report keeps its own words and figures, under this machine's Environment section."""
    folder = FIXTURES / f"{week}-handout"
    if not folder.is_dir():  # a learner release leaves it out, as the reference (tests/conftest.py skips then)
        raise FileNotFoundError(2, "No such file or directory", str(folder))
    edits = {str(p.relative_to(folder)): p.read_bytes() if p.suffix == ".png" else p.read_text()
             for p in sorted(folder.rglob("*")) if p.is_file()}
    if "report.md" in edits:
        edits["report.md"] = with_stamped_environment(edits["report.md"])
    return edits
