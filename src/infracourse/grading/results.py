"""What a grade produces: one result per check, and the week's verdict."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Status = Literal["passed", "failed", "error", "blocked"]
STATUSES = ("passed", "failed", "error", "blocked")


@dataclass
class CheckResult:
    id: str
    title: str
    kind: str
    needs: str
    status: Status
    message: str = ""
    figures: dict[str, dict] = field(default_factory=dict)  # name -> {value, target, unit, ...}
    seconds: float = 0.0

    @property
    def headline(self) -> dict | None:
        """The figure shown in the results table: the first one recorded."""
        return next(iter(self.figures.values()), None)


@dataclass
class GradeResult:
    week: str
    tier: str
    device: str
    fingerprint: str
    started_at: str
    seconds: float
    checks: list[CheckResult]
    grader_version: str = ""
    sandboxed: bool = True  # learner code ran in the sandbox (infracourse.sandbox); False: it could not, here

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checks)

    @property
    def complete(self) -> bool:
        """Every check that could run here passed (blocked ones are owed to other hardware), and at least one
        check of the learner's answers (kind correctness) ran and passed here: a week whose every
        correctness check was blocked is not complete on this machine."""
        return bool(self.checks) and all(c.status in ("passed", "blocked") for c in self.checks) \
            and any(c.status == "passed" and c.kind == "correctness" for c in self.checks)

    @property
    def verified_on_gpu(self) -> bool:
        gpu = [c for c in self.checks if c.needs != "cpu"]
        return self.complete and bool(gpu) and all(c.status == "passed" for c in gpu)

    def as_dict(self) -> dict:
        return asdict(self) | {"complete": self.complete, "verified_on_gpu": self.verified_on_gpu,
                               "counts": {s: self.count(s) for s in STATUSES}}

    @classmethod
    def from_dict(cls, data: dict) -> "GradeResult":
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["checks"] = [CheckResult(**{k: v for k, v in c.items() if k in CheckResult.__dataclass_fields__})
                            for c in data["checks"]]
        return cls(**fields)
