"""The learner's own figures for the `measured` drill questions: read from each week's last recorded grade,
so a question asks about what *their* kernel, collective or server did on *their* machine (003 §11: estimate,
then explain the measured difference)."""
from __future__ import annotations

from infracourse.drills.content import Question
from infracourse.grading.results import GradeResult


def figures(question: Question, last_grade) -> dict[str, float] | None:
    """name -> value for every figure the question reads, or None when one is missing. `last_grade(week)`
    returns that week's last GradeResult (or None)."""
    found = {}
    for name, spec in question.measured.items():
        value = _field(last_grade(spec.week), spec.check, spec.figure, spec.field)
        if value is None:
            return None
        found[name] = value
    return found


def _field(result: GradeResult | None, check_id: str, figure_name: str, field: str) -> float | None:
    if result is None:
        return None
    check = next((c for c in result.checks if c.id == check_id and c.status == "passed"), None)
    figure = check and check.figures.get(figure_name)
    if figure is None:
        return None
    value = getattr(figure, field, None) if field in figure.__dataclass_fields__ else figure.detail.get(field)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def examples(question: Question) -> dict[str, float]:
    """The stand-in figures a course author gave, for checking the question without a grade."""
    return {name: spec.example for name, spec in question.measured.items()}
