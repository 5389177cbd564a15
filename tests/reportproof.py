"""Edits of a solution's report.md for the lab proofs (tests/test_weekNN.py) of the report check: the same
facts in other words must pass, an invented figure must fail."""
from __future__ import annotations

import re

from infracourse.grading.report import sections

PROSE = ("Question and hypothesis", "Workload", "Method", "Correctness criterion", "Conclusion and limits")


def reworded(text: str) -> str:
    """Each prose section said differently: its sentences in reverse order and without a digit, so no rule of
    the old regex graders (a number beside 'warm-up', 'bottleneck' with a figure on its line, ...) holds."""
    found = sections(text)
    for heading in PROSE:
        body = found[heading]
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\d", "", body)) if s.strip()]
        text = text.replace(body, "Said another way: " + " ".join(reversed(sentences)), 1)
    return text


def invented(name: str, factor: float = 10.0):
    """An edit that multiplies the figure `name` of the report's figures block by `factor`."""
    def _edit(text: str) -> str:
        pattern = re.compile(rf"^({re.escape(name)}:\s*)([-+0-9.eE]+)", re.MULTILINE)
        assert len(pattern.findall(text)) == 1, f"expected one {name!r} in the report's figures block"
        return pattern.sub(lambda m: f"{m.group(1)}{float(m.group(2)) * factor:.6g}", text)

    return _edit
