"""`infracourse measure`: the report's figures from this machine and this code, measured as the grader does.

A report figure that a check measures (lab.yaml `report.figures`, with `check` and `measured`) is compared with
that check's own measurement in every grade. Copied by hand from another run, or from another machine, it is
off by whatever differs between the two. So `measure` grades the checks that measure the figures (a partial
grade: they and what they require) and writes what they recorded into the report's ```yaml figures block,
line by line: other lines and everything outside the block stay as written. A figure the lab computes from
its fixed configuration (`expected`) is the learner's to work out and is never written; one whose check did
not pass, or is blocked here, is left as it was and said why.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

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


def figures_of_grade(spec: Lab, result: GradeResult) -> Measured:
    """What the grade's checks recorded for each report figure a check measures."""
    checks = {c.id: c for c in result.checks}
    measured = Measured()
    for figure in spec.report.figures:
        check = checks.get(figure.check) if figure.check else None
        if check is None:
            continue
        recorded = check.figures.get(figure.measured)
        value = getattr(recorded, figure.compare_with, None) if recorded else None
        if check.status != "passed" or value is None:
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
