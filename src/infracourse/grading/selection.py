"""Which checks a partial grade runs: those the learner names (`--check ID`, `-k PATTERN`) and what they need.

A partial grade is for iterating on one check in seconds; it never completes a week (GradeResult.partial).
What a named check needs comes with it, so its verdict is the one a whole grade would give:
- every check it `requires` (lab.yaml), transitively: the runner withholds credit unless they pass too;
- for a weekly `report` check, the checks its figures name (lab.yaml `report.figures[].check`): it compares each
  figure with what that check measured in the same grade, and reads no other check's result;
- for a track project's report, the whole week: its to_be_verified list must name exactly the checks blocked
  here, so it reads every other check's status.
A check this machine blocks (its `needs` are missing) brings nothing: it is `blocked` whatever its requires say
(the runner never withholds a blocked check's status), and a report does not compare its figures.
`-k` takes pytest's -k expressions over check ids (`-k add`, `-k "reduce and not bandwidth"`): a word matches
an id that contains it, case-insensitively.
"""
from __future__ import annotations

from typing import Callable, Iterable

from _pytest.mark.expression import Expression

try:  # pytest 8 raises its own ParseError on a malformed -k expression, pytest 9 a SyntaxError
    from _pytest.mark.expression import ParseError as KSyntaxError
except ImportError:
    KSyntaxError = SyntaxError

from infracourse.grading.shared import is_project
from infracourse.syllabus import Lab


class SelectionError(ValueError):
    """Named checks that the week does not have, or a -k pattern that matches none; the message says which."""


def named_checks(spec: Lab, ids: Iterable[str] = (), pattern: str | None = None) -> list[str] | None:
    """The check ids the learner named, in lab.yaml's order; None when nothing was named (the whole week)."""
    ids = list(ids)
    if not ids and not pattern:
        return None
    known = [c.id for c in spec.checks]
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise SelectionError(f"{spec.week} has no check {', '.join(map(repr, unknown))}: its checks are "
                             f"{', '.join(known)} (lab.yaml); name one of them with --check")
    chosen = set(ids)
    if pattern:
        expression = _expression(pattern)
        matched = {i for i in known if expression.evaluate(lambda word, **_: word.lower() in i.lower())}
        if not matched:
            raise SelectionError(f"-k {pattern!r} matches no check of {spec.week}: its checks are "
                                 f"{', '.join(known)}; a word matches an id that contains it")
        chosen |= matched
    return [i for i in known if i in chosen]


def with_prerequisites(spec: Lab, ids: Iterable[str], blocked: Callable | None = None) -> list[str]:
    """`ids` and every check they need for a whole-grade verdict (module docstring), in lab.yaml's order.
    `blocked(check)`: whether this machine blocks it; such a check needs nothing else graded."""
    needed: set[str] = set()
    todo = list(ids)
    while todo:
        check = spec.check(todo.pop())
        if check.id in needed:
            continue
        needed.add(check.id)
        if blocked is not None and blocked(check):
            continue
        if check.kind == "report":
            if is_project(spec):
                return [c.id for c in spec.checks]
            todo.extend(f.check for f in (spec.report.figures if spec.report else []) if f.check)
        todo.extend(check.requires)
    return [c.id for c in spec.checks if c.id in needed]


def _expression(pattern: str) -> Expression:
    try:
        return Expression.compile(pattern)
    except KSyntaxError as exc:
        why = getattr(exc, "message", None) or getattr(exc, "msg", None) or str(exc)
        raise SelectionError(f"-k {pattern!r} is not a pytest -k expression ({why}): use words joined by "
                             "and / or / not, e.g. -k \"reduce and not bandwidth\"") from None
