"""What `infracourse dev check` refuses in the drill files: a question naming a week the syllabus lacks, a
measured figure of a check its lab does not define, and an estimate whose formula, for any of SEEDS draws,
is not a finite positive number or whose text names a value no parameter defines."""
from __future__ import annotations

from infracourse.course import Course
from infracourse.drills import content, engine, measured
from infracourse.syllabus import CourseFileError

SEEDS = range(24)  # enough draws to meet every choice of a small parameter grid in practice


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
    return found


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
