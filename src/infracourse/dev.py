"""`infracourse dev check`: what a course author must not ship (after rustlings' `dev check`).

For each built lab: lab.yaml loads; hints are not empty; starter/ and solution/ hold the same file names;
no stray files (caches, editor droppings) ship; every check in lab.yaml has a grader test and every grader
test names a known check; the syllabus' acceptance entries name existing checks; `kit` covers what the starter
and solution import of the course kit, and the handout names each of its modules; each rubric item names a
completion criterion of the syllabus (lab.yaml's schema checks its section and levels); the untouched starter
does not complete; the solution completes (its report stamped with this machine's environment).
"""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from infracourse import kit_access
from infracourse.course import Course, LabDir
from infracourse.drills import audit
from infracourse.grading.report import stamp_environment
from infracourse.grading.runner import grade as grade_lab
from infracourse.grading.shared import shared_tests
from infracourse.hardware import detect
from infracourse.syllabus import CourseFileError

STRAY = re.compile(r"(__pycache__|\.pyc$|\.DS_Store$|~$|\.swp$|\.ipynb_checkpoints|\.backup-|\.grade)")
CHECK_MARK = re.compile(r"""mark\.check\(\s*["']([a-z0-9-]+)["']""")


def _names(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def static_problems(course: Course, lab: LabDir) -> list[str]:
    spec, where = lab.spec, lab.path
    problems = []
    if any(not h.strip() for h in spec.hints):
        problems.append(f"{where}/lab.yaml: an empty hint; write it or remove it")
    for side in (lab.starter, lab.solution):
        stray = sorted(n for n in _names(side) if STRAY.search(n)) if side.is_dir() else []
        if stray:
            problems.append(f"{side}: stray files {stray}; delete them")
    if not lab.starter.is_dir() or not lab.solution.is_dir():
        return problems + [f"{where}: needs both starter/ and solution/"]
    starter, solution = _names(lab.starter), _names(lab.solution)
    # what the learner's own scripts write (week 6's traces/) ships with the solution and cannot be a starter file
    solution = {n for n in solution if not any(n == g or (g.endswith("/") and n.startswith(g)) for g in spec.generated)}
    if starter != solution:
        problems.append(f"{where}: starter/ and solution/ differ in file names: only in starter "
                        f"{sorted(starter - solution)}, only in solution {sorted(solution - starter)}")
    missing = [f for f in spec.files if f not in starter]
    if missing:
        problems.append(f"{where}/lab.yaml: files {missing} are not in starter/")
    shared = set(shared_tests(spec))  # the shared checks lab.yaml asks for (the report, a project's five)
    own = set()
    for test in lab.graders.glob("test_*.py"):
        own |= set(CHECK_MARK.findall(test.read_text()))
    if own & shared:
        problems.append(f"{lab.graders}: tests decide checks {sorted(own & shared)}, which the shared checks "
                        "(infracourse.grading.shared) already decide: one test per check; remove the week's own")
    marked = own | shared
    ids = {c.id for c in spec.checks}
    marked -= set(spec.later)  # a project's checks of later weeks
    if ids - marked:
        problems.append(f"{lab.graders}: no grader test for checks {sorted(ids - marked)}")
    if marked - ids:
        problems.append(f"{lab.graders}: tests name checks {sorted(marked - ids)} that lab.yaml does not define")
    week = course.week(spec.week)
    named = {c for _, checks in course.acceptance(week, track=lab.track) for c in checks}
    if named - ids:
        problems.append(f"curriculum/syllabus.yaml {week.id}: acceptance names unknown checks {sorted(named - ids)}")
    problems += kit_access.handout_problems(where, spec.kit)
    criteria = {c.id for c in course.syllabus.completion}
    for item in spec.rubric:
        if item.criterion is not None and item.criterion not in criteria:
            problems.append(f"{where}/lab.yaml: rubric item {item.id!r} names criterion {item.criterion!r}, not one of "
                            f"the syllabus' completion criteria {sorted(criteria)}; use one of them or leave it out")
    return problems


def grading_problems(course: Course, lab: LabDir) -> list[str]:
    hw = detect()
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("starter", "solution"):
            folder = Path(tmp) / side
            shutil.copytree(getattr(lab, side), folder)
            if side == "solution" and lab.spec.report:
                stamp_environment(folder / lab.spec.report, hw)
            result = grade_lab(course, lab, folder, hardware=hw)
            if side == "starter" and result.complete:
                problems.append(f"{lab.starter}: the untouched starter completes the week; its checks cannot fail")
            if side == "solution" and not result.complete:
                bad = [f"{c.id}: {c.status} ({c.message[:160]})" for c in result.checks
                       if c.status not in ("passed", "blocked")]
                problems.append(f"{lab.solution}: the solution does not complete the week: " + "; ".join(bad))
    return problems


def check_course(course: Course, week: str | None = None, *, grade: bool = True,
                 log: Callable[[str], None] = lambda _m: None) -> list[str]:
    try:
        labs = [course.lab(week)] if week else course.labs()
        if not week:  # every track's whole project (week 24 grades all of it), whichever the learner chose
            labs += [course.lab(w, track=t) for w in course.syllabus.weeks if w.on_track and w.id == "week24"
                     for t in course.tracks if t != course.track_id]
    except (CourseFileError, KeyError) as exc:
        return [str(exc)]
    problems = []
    for lab in labs:
        log(f"checking {lab.spec.week} ({lab.path.name})")
        problems += static_problems(course, lab)
        if grade:
            problems += grading_problems(course, lab)
    if not week:  # the drill files: weeks, measured checks and every estimate's formula over many draws
        log("checking the drills (curriculum/drills)")
        problems += audit.problems(course)
    return problems
