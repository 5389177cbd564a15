"""Per-week deadlines and the late policy, from the cohort's config (`cohort.yaml` beside the gradebook).

```yaml
deadlines:               # UTC, ISO 8601; a week without a deadline is never late
  week01: 2026-02-02T23:59:00Z
late:
  policy: penalty        # flag | grace | penalty
  grace_hours: 24        # time after the deadline that still counts as on time
  penalty_per_day: 0.1   # penalty: share of the week's points lost per started day past the grace
  max_penalty: 0.5       # penalty: at most this share is lost
```
`flag`: a late submission is marked, its points unchanged. `grace`: on time until the grace ends; past it,
marked late and worth no points. `penalty`: points scaled down per started day past the grace.

Lateness is judged on the time the gradebook *received* a submission (its import, or the `--received-at`
the instructor gives for a batch collected earlier), never the time written in the bundle by the learner's
clock. It is computed when read, so a deadline changed in the config applies to everything already
imported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infracourse.syllabus import WEEK_ID

CONFIG = "cohort.yaml"


class DeadlineError(Exception):
    """The cohort config cannot be used; the message names the file and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LatePolicy(_Strict):
    policy: Literal["flag", "grace", "penalty"] = "flag"
    grace_hours: float = Field(0.0, ge=0)
    penalty_per_day: float = Field(0.1, ge=0, le=1)
    max_penalty: float = Field(1.0, ge=0, le=1)


class CohortConfig(_Strict):
    deadlines: dict[str, datetime] = Field(default_factory=dict)
    late: LatePolicy = Field(default_factory=LatePolicy)


@dataclass(frozen=True)
class Lateness:
    late: bool = False
    hours: float = 0.0  # past the deadline (0 when on time or no deadline)
    factor: float = 1.0  # what the week's points are multiplied by

    @property
    def label(self) -> str:
        return f"late {self.hours:.1f} h" if self.late else ""


def config_path(gradebook_path: Path) -> Path:
    return Path(gradebook_path).with_name(CONFIG)


def load(gradebook_path: Path) -> CohortConfig:
    """The config beside a gradebook; no file: no deadlines."""
    path = config_path(gradebook_path)
    if not path.exists():
        return CohortConfig()
    try:
        data = yaml.safe_load(path.read_text()) or {}
        config = CohortConfig.model_validate(data)
    except yaml.YAMLError as exc:
        raise DeadlineError(f"{path}: not valid YAML ({exc}); fix it (see docs/instructors.md)") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise DeadlineError(f"{path}: {problems}; fix it (see docs/instructors.md, deadlines)") from None
    for week, when in config.deadlines.items():
        if not WEEK_ID.fullmatch(week):
            raise DeadlineError(f"{path}: deadlines: {week!r} is not a week id (weekNN)")
        if when.tzinfo is None:
            config.deadlines[week] = when.replace(tzinfo=timezone.utc)
    return config


def lateness(config: CohortConfig, week: str, received_at: str) -> Lateness:
    deadline = config.deadlines.get(week)
    received = parse_time(received_at)
    if deadline is None or received is None or received <= deadline:
        return Lateness()
    hours = (received - deadline).total_seconds() / 3600
    policy = config.late
    past_grace = hours - policy.grace_hours
    if policy.policy == "flag":
        return Lateness(True, hours, 1.0)
    if past_grace <= 0:
        return Lateness()
    if policy.policy == "grace":
        return Lateness(True, hours, 0.0)
    days = math.ceil(past_grace / 24)
    return Lateness(True, hours, 1.0 - min(policy.max_penalty, days * policy.penalty_per_day))


def past_deadline(config: CohortConfig, week: str, now: datetime | None = None) -> bool:
    deadline = config.deadlines.get(week)
    return deadline is not None and (now or datetime.now(timezone.utc)) > deadline


def parse_time(stamp: str) -> datetime | None:
    """An ISO time as UTC (a trailing Z, or none: UTC); None when it is not one."""
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
