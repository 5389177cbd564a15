"""`EnvConfig`: settings a judge (or a learner's script) hands to a server it starts, through one environment
variable holding a JSON object of a frozen dataclass's fields; absent fields keep their defaults."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from typing import ClassVar


class EnvConfig:
    env_var: ClassVar[str]  # the variable's name, set by each subclass

    @classmethod
    def from_env(cls, environ=None):
        raw = (environ if environ is not None else os.environ).get(cls.env_var, "")
        values = json.loads(raw) if raw else {}
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"{cls.env_var}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        return {self.env_var: json.dumps(asdict(self))}
