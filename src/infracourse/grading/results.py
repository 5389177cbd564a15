"""What a grade produces: one result per check, the figures it measured, and the week's verdict.

A measured figure is a `Figure`, the one model every module reads (the `record` fixture makes them, the
runner accepts them, views print them, plots draw them, progress and the gradebook store them). On disk it
is a flat JSON object, as it always was: {"value": 3788.0, "target": 2971.4, "unit": "GB/s", "label": ...}.
`Figure.from_dict` checks that object at every boundary (judge -> runner, results.json of a bundle, stored
grades): numbers finite, times, sizes and rates not negative, each known key of its type; keys no module
reads (`DETAIL_KEYS`: shape, model, ...) are kept in `detail` as plain JSON data.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["passed", "failed", "error", "blocked"]
STATUSES = ("passed", "failed", "error", "blocked")

# Descriptive keys a grader may record beside a figure (shown in result.json, read by no module). `record`
# refuses any other name, so a misspelt `reference_seconds` fails the grader's own lab proof.
DETAIL_KEYS = frozenset({"shape", "model", "batch", "calls_per_step", "peak_tflops", "copy_gbps",
                         "ratio_to_reference", "gbps", "torch_gbps", "timing", "reference_timing",
                         "target_is", "source"})
# target_is: "re-measured" when the target is the grader's own measurement; source: where a figure was measured
# ("device", or "cpu-stand-in" where a CPU stands in for the device a serving figure is about)
MAX_TEXT = 300  # a label, unit, reference or detail string
MAX_DETAIL = 16  # detail keys of one figure, items of one detail list or mapping


class FigureError(ValueError):
    """A figure that no grader of this course records: the message names the figure and the key."""


def _text(value: Any, key: str, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise FigureError(f"{key} must be text of at most {MAX_TEXT} characters, not {str(value)[:60]!r}")
    return value


def _number(value: Any, key: str, *, nonnegative: bool = False, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FigureError(f"{key} must be a finite number, not {str(value)[:60]!r}")
    if nonnegative and value < 0:
        raise FigureError(f"{key} must not be negative, not {value!r}")
    return float(value)


def _plain(value: Any, key: str, depth: int = 0) -> Any:
    """A detail value: text, a finite number, a bool, None, or a short list or mapping of those (a shape;
    bench.Timing.as_dict())."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, key)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _number(value, key)
    if isinstance(value, (list, tuple)) and depth == 0 and len(value) <= MAX_DETAIL:
        return [_plain(v, key, 1) for v in value]
    if isinstance(value, dict) and depth == 0 and len(value) <= MAX_DETAIL:
        return {_text(k, f"a key of {key}", optional=False): _plain(v, f"{key}.{k}", 1) for k, v in value.items()}
    raise FigureError(f"{key} must be text, a number or a short list or mapping of them, not {str(value)[:60]!r}")


@dataclass(frozen=True)
class Figure:
    """One measured figure of a check. `value` is what was measured, in `unit`; `target` the grader's bar
    (or its own measurement, for a figure a report states). The plots read label/bytes/flops/seconds/
    reference_seconds/reference; the cohort's fair comparison reads ceiling/fraction_of_ceiling."""
    value: float
    unit: str = ""
    target: float | None = None
    label: str | None = None  # the kernel measured: figures with one label are one kernel in the plots
    reference: str | None = None  # what reference_seconds timed (torch.softmax, cuBLAS, ...)
    seconds: float | None = None  # time per call of the learner's code
    reference_seconds: float | None = None
    bytes: float | None = None  # moved per call
    flops: float | None = None  # per call
    ceiling: float | None = None  # the device ceiling the value was judged against, in `unit`
    fraction_of_ceiling: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)  # DETAIL_KEYS only when recorded; read by no module

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "value", _number(self.value, "value", optional=False))
        set_(self, "unit", "" if self.unit is None else _text(self.unit, "unit"))
        set_(self, "target", _number(self.target, "target"))
        for key in ("label", "reference"):
            set_(self, key, _text(getattr(self, key), key))
        for key in ("seconds", "reference_seconds", "bytes", "flops", "ceiling", "fraction_of_ceiling"):
            set_(self, key, _number(getattr(self, key), key, nonnegative=True))
        if not isinstance(self.detail, dict) or len(self.detail) > MAX_DETAIL:
            raise FigureError(f"detail must be a mapping of at most {MAX_DETAIL} keys")
        clash = set(self.detail) & _TYPED
        if clash:
            raise FigureError(f"detail repeats the typed key(s) {sorted(clash)}")
        set_(self, "detail", {_text(k, "a detail key", optional=False): _plain(v, str(k))
                              for k, v in self.detail.items()})

    @classmethod
    def of(cls, value: float, *, target: float | None = None, unit: str | None = "", **extra: Any) -> "Figure":
        """What `record(name, value, target=, unit=, **extra)` stores: extra names a typed field or DETAIL_KEYS."""
        unknown = set(extra) - _TYPED - DETAIL_KEYS
        if unknown:
            raise FigureError(f"unknown figure key(s) {sorted(unknown)}: a figure takes {sorted(_TYPED)} and, as "
                              f"description, {sorted(DETAIL_KEYS)} (grading/results.py)")
        typed = {k: v for k, v in extra.items() if k in _TYPED}
        return cls(value=value, target=target, unit=unit, **typed,
                   detail={k: v for k, v in extra.items() if k in DETAIL_KEYS})

    @classmethod
    def from_dict(cls, data: Any) -> "Figure":
        """A figure from its JSON object (as `as_dict` writes it, and as every earlier version wrote it).
        Typed keys are checked; any other key must be plain data and is kept in `detail`."""
        if not isinstance(data, dict):
            raise FigureError(f"a figure is a JSON object, not {type(data).__name__}")
        if "value" not in data:
            raise FigureError("a figure has no value")
        if len(data) > len(_TYPED) + 1 + MAX_DETAIL:
            raise FigureError(f"a figure has {len(data)} keys")
        typed = {k: v for k, v in data.items() if k in _TYPED}
        detail = {k: v for k, v in data.items() if k not in _TYPED and k != "value"}
        return cls(value=data["value"], **typed, detail=detail)

    @classmethod
    def coerce(cls, figure: Any) -> "Figure":
        return figure if isinstance(figure, cls) else cls.from_dict(figure)

    def as_dict(self) -> dict[str, Any]:
        """The flat JSON object stored on disk: value, target and unit always, other keys when set."""
        data: dict[str, Any] = {"value": self.value, "target": self.target, "unit": self.unit}
        for key in _OPTIONAL:
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data | self.detail

    def shown(self) -> tuple[str, str]:
        """(measured, target) as the results table prints them, e.g. ("3788 GB/s", "2971 GB/s")."""
        target = f"{self.target:.4g} {self.unit}".strip() if self.target is not None else ""
        return f"{self.value:.4g} {self.unit}".strip(), target

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Pydantic (a bundle's results.json) validates a figure with from_dict and writes it with as_dict."""
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.coerce, serialization=core_schema.plain_serializer_function_ser_schema(lambda f: f.as_dict()))


_OPTIONAL = ("label", "reference", "seconds", "reference_seconds", "bytes", "flops", "ceiling", "fraction_of_ceiling")
_TYPED = frozenset({"unit", "target", *_OPTIONAL})  # keyword fields besides value and detail


def figures_of(raw: Any) -> dict[str, Figure]:
    """Check a check's figures (name -> Figure or its JSON object); FigureError names the bad one."""
    if not isinstance(raw, dict):
        raise FigureError(f"figures must be a mapping of name to figure, not {type(raw).__name__}")
    checked = {}
    for name, figure in raw.items():
        if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
            raise FigureError(f"a figure name must be text of 1 to {MAX_TEXT} characters, not {str(name)[:60]!r}")
        try:
            checked[name] = Figure.coerce(figure)
        except FigureError as exc:
            raise FigureError(f"figure {name!r}: {exc}") from None
    return checked


@dataclass
class CheckResult:
    id: str
    title: str
    kind: str
    needs: str
    status: Status
    message: str = ""
    figures: dict[str, Figure] = field(default_factory=dict)  # name -> Figure (its JSON object is accepted)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.figures = figures_of(self.figures)

    @property
    def headline(self) -> Figure | None:
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
    partial: bool = False  # only some checks were graded (`grade --check`/`-k`): never completes the week
    # constructs of the learner's files that reach the grading worker's internals (grading.provenance), as
    # `cohort regrade` read them: for the instructor to look at, whatever the checks say
    provenance: list[str] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checks)

    @property
    def all_passed(self) -> bool:
        """Every check graded passed, or is blocked here: what a partial grade's exit code says."""
        return bool(self.checks) and all(c.status in ("passed", "blocked") for c in self.checks)

    @property
    def complete(self) -> bool:
        """Every check that could run here passed (blocked ones are owed to other hardware), and at least one
        check of the learner's answers (kind correctness) ran and passed here: a week whose every
        correctness check was blocked is not complete on this machine. A partial grade never is."""
        return not self.partial and self.all_passed \
            and any(c.status == "passed" and c.kind == "correctness" for c in self.checks)

    @property
    def verified_on_gpu(self) -> bool:
        gpu = [c for c in self.checks if c.needs != "cpu"]
        return self.complete and bool(gpu) and all(c.status == "passed" for c in gpu)

    def as_dict(self) -> dict:
        data = asdict(self)
        for check, stored in zip(self.checks, data["checks"]):
            stored["figures"] = {name: figure.as_dict() for name, figure in check.figures.items()}
        return data | {"complete": self.complete, "verified_on_gpu": self.verified_on_gpu,
                       "counts": {s: self.count(s) for s in STATUSES}}

    @classmethod
    def from_dict(cls, data: dict) -> "GradeResult":
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["checks"] = [CheckResult(**{k: v for k, v in c.items() if k in CheckResult.__dataclass_fields__})
                            for c in data["checks"]]
        return cls(**fields)
