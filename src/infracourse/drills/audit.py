"""What `infracourse dev check` refuses in the drill files: a question naming a week the syllabus lacks, a
measured figure of a check its lab does not define, an estimate whose formula, for any of SEEDS draws, is not
a finite positive number or whose text names a value no parameter defines, and an estimate with no
independent check: every numeric question's id must be a key of the `INDEPENDENT` dict in
INDEPENDENT_TESTS (a computation that does not share its formula, run by that test file). The keys are read
from the file's syntax tree, not by importing it (that needs torch and pytest); a course folder without the
file (an installed wheel, which ships no tests) is not checked for it."""
from __future__ import annotations

import ast
from pathlib import Path

from infracourse.course import Course
from infracourse.drills import content, engine, measured
from infracourse.syllabus import CourseFileError

SEEDS = range(24)  # enough draws to meet every choice of a small parameter grid in practice
INDEPENDENT_TESTS = Path("tests") / "test_drills_formulas.py"  # beside curriculum/ in a checkout


def problems(course: Course) -> list[str]:
    try:
        questions = content.load(course.root) + content.load(course.root, selftest=True)
    except CourseFileError as exc:
        return [str(exc)]
    where = content.drills_dir(course.root)
    weeks = {w.id: w for w in course.syllabus.weeks}
    found = []
    for q in questions:
        if q.week not in weeks:
            found.append(f"{where}: question {q.id} names {q.week}, which the syllabus does not have")
            continue
        for name, spec in q.measured.items():
            try:
                checks = {c.id for c in course.lab(spec.week).spec.checks}
            except (CourseFileError, KeyError) as exc:
                checks, reason = set(), str(exc)
            else:
                reason = f"its lab's checks are {sorted(checks)}"
            if spec.check not in checks:
                found.append(f"{where}: question {q.id}, measured {name}: {spec.week} has no check {spec.check!r} "
                             f"({reason}); name one of its checks")
        found += _draw_problems(q, where)
    return found + unchecked(course.root, questions)


def independent_ids(test_file: Path) -> set[str] | None:
    """The string keys of the module-level `INDEPENDENT = {...}` in test_file; None when the file is absent."""
    try:
        tree = ast.parse(test_file.read_text(encoding="utf-8"), str(test_file))
    except FileNotFoundError:
        return None
    for node in tree.body:
        named = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "INDEPENDENT"
                                                     for t in node.targets)
        if named and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return set()


def unchecked(root: Path, questions: list[content.Question]) -> list[str]:
    """A problem for each estimate whose formula no independent computation checks."""
    test_file = root / INDEPENDENT_TESTS
    known = independent_ids(test_file)
    if known is None:
        return []
    return [f"{content.drills_dir(root)}: question {q.id} ({q.kind}, {q.estimate}) has no independent check: add "
            f"{q.id!r} to INDEPENDENT in {test_file}, computed without its formula (a tensor's nbytes, a loop, "
            "a simulation, a published figure)" for q in questions if q.numeric and q.id not in known]


def _draw_problems(q: content.Question, where) -> list[str]:
    figures = measured.examples(q) if q.kind == "measured" else None
    for seed in SEEDS:
        try:
            inst = engine.instantiate(q, seed, figures)
            outcome = engine.reveal(inst)
        except (ValueError, ZeroDivisionError, OverflowError) as exc:
            return [f"{where}: question {q.id}, seed {seed}: {exc}; fix its formula or text"]
        if q.numeric and not inst.expected > 0:
            return [f"{where}: question {q.id}, seed {seed}: the answer is {inst.expected}, not a positive number; "
                    "an estimate's parameters must give a positive answer"]
        if not outcome.explanation.strip():
            return [f"{where}: question {q.id}: no explanation; write its explain:"]
    return []
