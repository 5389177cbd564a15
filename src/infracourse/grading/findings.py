"""What the judge's reading of the learner's sources reports (grading.provenance, with the rules of
grading.forbidden and the kernel reach of grading.kernel_reach): a `Finding`, and how much of one file it reads."""
from __future__ import annotations

from dataclasses import dataclass

MAX_SOURCE_BYTES = 1 << 20  # a learner's .py is a few kB: the judge reads no more than this of one


@dataclass(frozen=True)
class Finding:
    file: str       # relative to the snapshot
    line: int
    construct: str  # what was found, as written or named
    fix: str        # one sentence a learner can act on

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.construct}: {self.fix}"
