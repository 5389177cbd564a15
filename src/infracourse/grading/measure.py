"""`infracourse measure`: the report's figures from this machine and this code, measured as the grader does.

A report figure that a check measures (lab.yaml `report.figures`, with `check` and `measured`) is compared with
that check's own measurement in every grade. Copied by hand from another run, or from another machine, it is
off by whatever differs between the two. So `measure` grades the checks that measure the figures (a partial
grade: they and what they require) and writes what they recorded into the report's ```yaml figures block,
line by line: other lines and everything outside the block stay as written. A figure the lab computes from
its fixed configuration (`expected`) is the learner's to work out and is never written; one whose check did
not pass, or is blocked here, is left as it was and said why. A figure `derived` from the block's others (week
12's efficiencies: T1 / T2 of the block's own step times) is written last, from its check graded again on the
block the first grade rewrote: taken from the first grade, it would follow the old timings.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from infracourse.grading.report_check import FIGURES_BLOCK
from infracourse.grading.results import GradeResult
from infracourse.failures import LabCheckFailed
from infracourse.syllabus import Lab, ReportFigure


@dataclass
class Measured:
    figures: dict[str, float] = field(default_factory=dict)  # report name -> the grader's figure
    left: dict[str, str] = field(default_factory=dict)  # report name -> why it was not measured here


def measuring_checks(spec: Lab) -> list[str]:
    """The checks that measure the report's figures, in lab.yaml's order (empty: nothing to measure)."""
    named = {f.check for f in spec.report.figures if f.check} if spec.report else set()
    return [c.id for c in spec.checks if c.id in named]


def derived_checks(spec: Lab) -> list[str]:
    """The checks that compute report figures from the block's other figures (graded again after writing)."""
    named = {f.check for f in spec.report.figures if f.check and f.derived} if spec.report else set()
    return [c.id for c in spec.checks if c.id in named]


def measure_report(spec: Lab, path: Path, grade_checks) -> tuple[str, str, Measured]:
    """Rewrite the report at `path` from grades of the checks that measure its figures (`grade_checks(ids)`
    grades those checks of the folder and returns the GradeResult): the measured figures first, then the
    derived ones, from their checks graded on the rewritten file. Returns (old text, new text, what was
    measured); the file is left as it was when a grade or the block fails."""
    old = path.read_text(encoding="utf-8")
    measured = figures_of_grade(spec, grade_checks(measuring_checks(spec)), derived=False)
    new = write_figures(old, measured.figures, path.name)
    if derived := derived_checks(spec):
        path.write_text(new, encoding="utf-8")
        try:
            then = figures_of_grade(spec, grade_checks(derived), derived=True)
            new = write_figures(new, then.figures, path.name)
        except BaseException:
            path.write_text(old, encoding="utf-8")
            raise
        measured.figures.update(then.figures)
        measured.left.update(then.left)
    path.write_text(new, encoding="utf-8")
    return old, new, measured


def figures_of_grade(spec: Lab, result: GradeResult, derived: bool | None = None) -> Measured:
    """What the grade's checks recorded for each report figure a check measures (only the `derived` ones, or
    only the others, when it is given)."""
    checks = {c.id: c for c in result.checks}
    measured = Measured()
    for figure in spec.report.figures:
        if derived is not None and figure.derived != derived:
            continue
        check = checks.get(figure.check) if figure.check else None
        if check is None:
            continue
        recorded = check.figures.get(figure.measured)
        value = getattr(recorded, figure.compare_with, None) if recorded else None
        # a derived figure's check also holds the block to its relations, so it fails while the block still
        # carries the old figure: what it recorded is the figure computed from the rewritten block all the same
        if (check.status != "passed" and not (figure.derived and check.status == "failed")) or value is None:
            measured.left[figure.name] = f"{check.id} {check.status}" + (f": {check.message}" if check.message else "")
        else:
            measured.figures[figure.name] = _written(value, figure)
    return measured


def write_figures(text: str, figures: dict[str, float], name: str) -> str:
    """`text` with each figure's line of the figures block set to its value (a missing line added at the end
    of the block); LabCheckFailed, naming the fix, when there is no single block."""
    blocks = list(FIGURES_BLOCK.finditer(text))
    if len(blocks) != 1:
        raise LabCheckFailed(f"{name} has {len(blocks)} figures blocks: keep exactly one (the template's ```yaml "
                             "figures block; `infracourse reset` restores the template, backing yours up)")
    body = blocks[0].group(1)
    for key, value in figures.items():
        line = re.compile(rf"^{re.escape(key)}[ \t]*:.*$", re.MULTILINE)
        body = line.sub(f"{key}: {value}", body, count=1) if line.search(body) else f"{body}{key}: {value}\n"
    start, end = blocks[0].span(1)
    return text[:start] + body + text[end:]


def diff(old: str, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), name, f"{name} (measured)"))


def _written(value: float, figure: ReportFigure):
    """As the block states it: whole numbers whole, others to six significant digits unless the figure must
    match exactly (no tolerance), where every digit is kept."""
    if float(value).is_integer():
        return int(value)
    return float(f"{value:.6g}") if figure.factor > 1 or figure.absolute > 0 else float(value)
