"""The drill files: `curriculum/drills/*.yaml` (one per phase of the course, and `selftest.yaml`), their
pydantic models, and the loader that refuses a file naming an unknown week, topic, unit or formula name.

A file is `format_version: 1` and `questions:`, a list of `Question`s. Kinds:
  estimate  a number computed by `answer` (a formula over `params`, drawn afresh for every instance, and
            `let`, values derived from them), in `unit`, accepted within `tolerance` (relative);
            `working` shows how it is computed, after the learner answered
  measured  an estimate whose parameters include figures the learner's own graded labs recorded (`measured`)
  choice    one right option of `options` (`correct`: its 0-based index); `multi`: every right one
  order     `options` written in the right order, shown shuffled; the learner types the letters in order
Every question has an `explain`: the reasoning shown after any answer.

`load` reads and validates the YAML (course authors, `dev check`); `bank` is what a sitting reads: the same
questions from a compiled cache (JSON of the validated models, in the workspace) while no drill file changed,
so `drill` and `selftest` start without YAML parsing or validation (docs/cli-speed.md).
"""
from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infracourse.drills import answers, formula
from infracourse.syllabus import CourseFileError

FORMAT_VERSION = 1
SELFTEST_FILE = "selftest.yaml"
# The per-topic score of `drill --mock` and the cohort's accuracy are counted over these.
TOPICS = ("measurement", "data-loading", "tensors-autograd", "training-loop", "mixed-precision", "memory",
          "gpu-architecture", "kernels", "roofline", "fusion", "collectives", "data-parallel", "scaling",
          "zero-fsdp", "model-parallel", "moe", "overlap", "gradient-compression", "kv-cache", "batching",
          "quantization", "speculative", "serving", "capacity", "cost", "data-pipeline", "reliability")
ESTIMATES = ("memory-inference", "memory-training", "memory-zero", "kv-cache", "intensity", "roofline",
             "allreduce-ring", "allreduce-hierarchical", "scaling", "mfu", "capacity", "cost", "other")


class _Strict(BaseModel):
    # validators built on first validation, which a sitting (reading the compiled bank) never does
    model_config = ConfigDict(extra="forbid", defer_build=True)


class Param(_Strict):
    """One generated parameter: exactly one of `choices` (a value, or a mapping of named values drawn
    together, e.g. a model's layers and heads), `range` (uniform; with `step`, on that grid) or `pow2`
    (2^k, k drawn from the inclusive exponent range)."""
    choices: Optional[list[Union[float, int, str, dict[str, Union[float, int, str]]]]] = None
    range: Optional[tuple[float, float]] = None
    step: Optional[float] = Field(None, gt=0)
    pow2: Optional[tuple[int, int]] = None

    @model_validator(mode="after")
    def _one_kind(self):
        given = [k for k in ("choices", "range", "pow2") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of choices, range, pow2 (given: {given or 'none'})")
        return self


class Measured(_Strict):
    """A figure of the learner's last grade of `week`: check `check`, figure `figure`, its `field` (value,
    seconds, bytes, flops, target or a detail key). `example` stands in when the course checks itself."""
    week: str
    check: str
    figure: str
    field: str = "value"
    example: float


class Mistake(_Strict):
    """A wrong working learners use, as a formula; an answer matching it is told `say`."""
    formula: str
    say: str


class Question(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    week: str = Field(pattern=r"^week\d\d$", description="the week whose material this drills")
    topic: str
    kind: Literal["estimate", "measured", "choice", "multi", "order"]
    estimate: Optional[str] = Field(None, description="estimates: the family of 003 §9 it practises")
    prompt: str
    params: dict[str, Param] = {}
    let: dict[str, str] = Field({}, description="derived values, in order: name -> formula")
    measured: dict[str, Measured] = {}
    answer: Optional[str] = Field(None, description="estimates: the formula of the right answer")
    unit: Optional[str] = None
    tolerance: float = Field(0.05, gt=0, le=0.5, description="relative")
    working: Optional[str] = Field(None, description="estimates: the worked solution, with {names} filled in")
    mistakes: list[Mistake] = []
    options: list[str] = []
    correct: list[int] = []
    explain: str

    @property
    def numeric(self) -> bool:
        return self.kind in ("estimate", "measured")

    @field_validator("answer", mode="before")
    @classmethod
    def _number_is_formula(cls, value):
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _consistent(self):
        if self.topic not in TOPICS:
            raise ValueError(f"topic {self.topic!r} is not one of {', '.join(TOPICS)}")
        if self.numeric:
            if not (self.answer and self.unit and self.working and self.estimate):
                raise ValueError("an estimate needs answer (a formula), unit, working and estimate (its family)")
            if self.estimate not in ESTIMATES:
                raise ValueError(f"estimate {self.estimate!r} is not one of {', '.join(ESTIMATES)}")
            answers.lookup(self.unit)
            known = set(self._scalar_names())
            for name, text in self.let.items():
                _known_names(text, known, f"let {name}")
                known.add(name)
            for text in (self.answer, *(m.formula for m in self.mistakes)):
                _known_names(text, known, "answer")
            if self.kind == "measured" and not self.measured:
                raise ValueError("a measured question names the figures it reads (measured:)")
        else:
            if len(self.options) < 2:
                raise ValueError("a choice question needs two or more options")
            if self.kind == "order":
                if self.correct:
                    raise ValueError("an order question's options are written in the right order: no correct:")
            elif not self.correct or any(not 0 <= i < len(self.options) for i in self.correct):
                raise ValueError(f"correct must name 0-based indexes of options (0..{len(self.options) - 1})")
            elif self.kind == "choice" and len(self.correct) != 1:
                raise ValueError("a choice question has one right option; use kind multi for several")
        return self

    def _scalar_names(self) -> list[str]:
        names = list(self.measured)
        for name, param in self.params.items():
            mapping = next((c for c in (param.choices or []) if isinstance(c, dict)), None)
            names += list(mapping) if mapping else [name]
        return names


def _known_names(text: str, known: set[str], where: str) -> None:
    missing = formula.names(text) - known
    if missing:
        raise ValueError(f"{where} formula {text!r} reads {sorted(missing)}, which no param, let or measured "
                         "figure defines")


class DrillFile(_Strict):
    format_version: Literal[1]
    questions: list[Question]


def drills_dir(root: Path) -> Path:
    return root / "curriculum" / "drills"


@lru_cache(maxsize=8)
def _load(path: Path, stamp: float) -> DrillFile:
    import yaml  # here, not at import: a sitting reads the compiled bank

    data = None
    try:
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        return DrillFile.model_validate(data)
    except (yaml.YAMLError, ValidationError, formula.FormulaError, answers.AnswerError) as exc:
        detail = "; ".join(f"{_where(data, e['loc'])}: {e['msg']}" for e in exc.errors()) \
            if isinstance(exc, ValidationError) else str(exc)
        raise CourseFileError(f"{path}: {detail}") from None


def _where(data, loc) -> str:
    """questions.12.prompt -> "question mem-adam (12th), prompt": the id an author searches for."""
    parts = list(loc)
    if len(parts) >= 2 and parts[0] == "questions" and isinstance(parts[1], int):
        try:
            qid = data["questions"][parts[1]].get("id", "?")
        except (TypeError, IndexError, AttributeError):
            qid = "?"
        return f"question {qid} (#{parts[1] + 1})" + (f", {'.'.join(map(str, parts[2:]))}" if parts[2:] else "")
    return ".".join(map(str, parts)) or "file"


def _paths(root: Path, selftest: bool) -> list[Path]:
    folder = drills_dir(root)
    return sorted(p for p in folder.glob("*.yaml") if (p.name == SELFTEST_FILE) == selftest) if folder.is_dir() else []


def load(root: Path, selftest: bool = False) -> list[Question]:
    """Every drill question of the course (or the self-test's), ids unique across files."""
    paths = _paths(root, selftest)
    questions, seen = [], {}
    for path in paths:
        for q in _load(path, path.stat().st_mtime).questions:
            if q.id in seen:
                raise CourseFileError(f"{path}: question id {q.id!r} is also in {seen[q.id].name}; ids are unique")
            seen[q.id] = path
            questions.append(q)
    return questions


BANK_VERSION = 1  # bump when the models change shape


def bank(root: Path, selftest: bool = False, cache: Path | None = None) -> list[Question]:
    """`load`'s questions, through a compiled bank in the folder `cache` (None: no cache). The bank is used
    only while its stamp (every drill file's path, size and modification time, this module's own and
    BANK_VERSION) is the files' stamp now, so any edit compiles afresh; a bank that cannot be read or written
    is ignored (the YAML is read instead). A learner who edits their bank only changes their own practice:
    nothing graded reads it."""
    paths = _paths(root, selftest)
    if cache is None or not paths:
        return load(root, selftest)
    stamp = repr((BANK_VERSION, [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths],
                  os.stat(__file__).st_mtime_ns))
    compiled = cache / f"drills-{'selftest' if selftest else 'course'}.json"
    try:
        data = json.loads(compiled.read_text(encoding="utf-8"))
        if data["stamp"] == stamp:
            return [_construct(d) for d in data["questions"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    questions = load(root, selftest)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        part = compiled.with_name(compiled.name + f".{os.getpid()}.part")
        part.write_text(json.dumps({"stamp": stamp, "questions": [q.model_dump() for q in questions]}),
                        encoding="utf-8")
        part.replace(compiled)
    except OSError:
        pass  # a read-only workspace still drills, reading the YAML each time
    return questions


def _construct(d: dict) -> Question:
    """A Question from its validated dump, without validating again (that is what the bank saves)."""
    return Question.model_construct(**{
        **d, "params": {k: Param.model_construct(**v) for k, v in d["params"].items()},
        "measured": {k: Measured.model_construct(**v) for k, v in d["measured"].items()},
        "mistakes": [Mistake.model_construct(**m) for m in d["mistakes"]]})


def week_number(week: str) -> int:
    return int(re.sub(r"\D", "", week))


def json_schema() -> dict:
    return DrillFile.model_json_schema()
