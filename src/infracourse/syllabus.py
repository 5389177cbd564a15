"""The course's two kinds of definition file, as pydantic models, and their loaders.

`curriculum/syllabus.yaml` lists the 24 weeks; each `labs/weekNN-<slug>/lab.yaml` describes one lab.
Both carry `format_version`; every field is documented here, and `infracourse syllabus --schema` prints
the JSON Schema so an editor can validate the YAML while an author types.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infracourse.kit_access import kit_modules

FORMAT_VERSION = 1
WEEK_ID = re.compile(r"^week(0[1-9]|1[0-9]|2[0-4])$")
PROJECT_WEEKS = ("week22", "week23", "week24")  # a track's project, graded in three stages


class CourseFileError(Exception):
    """A course file is missing or malformed; the message names the file, the entry and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- syllabus.yaml
class Reading(_Strict):
    title: str = Field(description="What to read, as its authors title it.")
    url: str = Field(description="Where the official document or paper lives.")


class Criterion(_Strict):
    """One acceptance criterion (验收) of the syllabus block, and the checks that enforce it."""

    text: str = Field(description="The criterion in our own words.")
    checks: list[str] = Field(
        default_factory=list,
        description="Check ids (from the lab's lab.yaml) that enforce it; empty while the lab is planned.",
    )


class GpuBudget(_Strict):
    """What to rent for a week whose checks need GPUs (003 §10: decide experiments, memory, budget and stop
    conditions before renting)."""

    devices: int = Field(default=1, ge=1, description="GPUs in one machine the week's GPU checks need.")
    minutes: float = Field(gt=0, description="Device minutes for the week's GPU grades and runs: the reference's "
                           "grade time on an H200 (docs/gpu-results.md) times a few attempts, rounded up.")
    memory_gib: float = Field(gt=0, description="Device memory per GPU the largest check uses, GiB, rounded up.")


class Week(_Strict):
    id: str = Field(description="weekNN, 01..24.")
    phase: str = Field(description="The syllabus block, e.g. 'Weeks 7-10: device programming'.")
    title: str
    objectives: list[str] = Field(min_length=1)
    readings: list[Reading] = Field(default_factory=list)
    hours: float = Field(gt=0, description="Estimated hours of work (the syllabus suggests 8-12 a week).")
    gpu: GpuBudget | None = Field(default=None, description="For `infracourse doctor --plan`: what the week's GPU "
                                  "checks need (none: the week runs whole on a CPU).")
    lab: str = Field(description="Folder under labs/ holding this week's lab, 'planned' while unbuilt, or 'track': "
                     "the direction project of the track the learner chose (curriculum/tracks/*.yaml).")
    acceptance: list[Criterion] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _week_id(cls, value: str) -> str:
        if not WEEK_ID.match(value):
            raise ValueError(f"{value!r} is not weekNN with NN from 01 to 24")
        return value

    @property
    def number(self) -> int:
        return int(self.id[4:])

    @property
    def planned(self) -> bool:
        return self.lab == "planned"

    @property
    def on_track(self) -> bool:
        """The week grades the project of the learner's chosen track (weeks 22-24)."""
        return self.lab == "track"


class CompletionCriterion(_Strict):
    """One of the course's completion criteria (003 §11) and the checks that back it."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    text: str = Field(description="The criterion in our own words.")
    checks: list[str] = Field(min_length=1, description="'weekNN:check-id' entries; for the project weeks "
                              "(22-24) the check id of the chosen track's project.")

    @field_validator("checks")
    @classmethod
    def _week_check(cls, value: list[str]) -> list[str]:
        for entry in value:
            week, _, check = entry.partition(":")
            if not WEEK_ID.match(week) or not check:
                raise ValueError(f"{entry!r} is not weekNN:check-id")
        return value


class Syllabus(_Strict):
    format_version: Literal[1] = Field(description="Bumped when a field changes meaning.")
    title: str
    weeks: list[Week]
    completion: list[CompletionCriterion] = Field(
        default_factory=list, description="What finishing the course means (003 §11), each criterion mapped to the "
        "checks that back it; `infracourse status --completion` shows them.")

    @model_validator(mode="after")
    def _weeks_in_order(self) -> "Syllabus":
        ids = [w.id for w in self.weeks]
        if len(set(ids)) != len(ids):
            raise ValueError(f"week ids repeat: {sorted(i for i in ids if ids.count(i) > 1)}")
        if ids != sorted(ids):
            raise ValueError("weeks must be listed in order, week01 first")
        return self

    def week(self, ref: str | int) -> Week:
        """Find a week by 'week07', '7', 'w7' or 7."""
        wanted = normalise_week(ref)
        for week in self.weeks:
            if week.id == wanted:
                return week
        raise KeyError(f"no {wanted} in the syllabus (it has {self.weeks[0].id}..{self.weeks[-1].id})")


class Track(_Strict):
    """A direction of weeks 22-24 (curriculum/tracks/<id>.yaml): one project lab, graded in three stages."""

    format_version: Literal[1]
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="What `infracourse track choose` takes.")
    title: str
    summary: str = Field(description="What the project is, in two or three sentences.")
    lab: str = Field(description="The project's folder under labs/ (its graders in graders/<lab>).")
    gpu: GpuBudget | None = Field(default=None, description="What the project's GPU checks need, per project week "
                                  "(`doctor --plan`; none: no GPU checks).")
    weeks: dict[str, list[str]] = Field(description="week22/week23/week24 -> the project checks that week adds; "
                                        "a week grades its own checks and every earlier week's.")
    acceptance: dict[str, list[list[str]]] = Field(
        default_factory=dict, description="week22/23/24 -> for each acceptance criterion of that week in the "
        "syllabus (in order), the track's own checks that enforce it besides the generic project checks the "
        "syllabus names.")

    @field_validator("weeks")
    @classmethod
    def _project_weeks(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        if sorted(value) != list(PROJECT_WEEKS):
            raise ValueError(f"weeks must map week22, week23 and week24 (got {sorted(value)})")
        return value

    @model_validator(mode="after")
    def _acceptance_known(self) -> "Track":
        listed = {c for checks in self.weeks.values() for c in checks}
        for week, criteria in self.acceptance.items():
            if week not in self.weeks:
                raise ValueError(f"acceptance names {week!r}, not a project week")
            unknown = {c for checks in criteria for c in checks} - listed
            if unknown:
                raise ValueError(f"acceptance of {week} names checks no week lists: {sorted(unknown)}")
        return self

    def checks_until(self, week_id: str) -> list[str]:
        """The checks a grade of `week_id` runs: that week's and every earlier project week's."""
        return [c for week in sorted(self.weeks) if week <= week_id for c in self.weeks[week]]


def normalise_week(ref: str | int) -> str:
    text = str(ref).strip().lower()
    match = re.fullmatch(r"(?:week|w)?0*(\d{1,2})", text)
    if not match or not 1 <= int(match.group(1)) <= 24:
        raise KeyError(f"{ref!r} is not a week: use week07, 7 or w7 (weeks 1 to 24)")
    return f"week{int(match.group(1)):02d}"


# ---------------------------------------------------------------- lab.yaml
Need = str  # "cpu", "cuda", "multi-gpu:N", "multi-node", "docker" (a container engine), "k8s" (a cluster), "mlu"
NEEDS_TEXT = "'cpu', 'cuda', 'multi-gpu:N' (N from 2 to 9), 'multi-node', 'docker', 'k8s' or 'mlu'"


def valid_need(value: str) -> bool:
    return value in ("cpu", "cuda", "multi-node", "docker", "k8s", "mlu") or bool(re.fullmatch(r"multi-gpu:[2-9]", value))


class Check(_Strict):
    """One graded check. Its id is the pytest marker `@pytest.mark.check("<id>")` in graders/weekNN."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str = Field(description="One line a learner reads in the results table.")
    needs: Need = Field(default="cpu", description=f"{NEEDS_TEXT}: what the check needs.")
    kind: Literal["correctness", "performance", "report", "estimate"] = Field(
        default="correctness", description="'estimate': the learner computes a number before measuring it; the "
        "check verifies the formula, then the measurement against it (grading.estimate).")
    timeout_s: float = Field(default=120, gt=0, description="Wall-clock limit for this check alone.")
    threshold: float | None = Field(
        default=None, description="Target the check compares with (fraction of a ceiling, ratio, ...)."
    )
    requires: list[str] = Field(
        default_factory=list,
        description="Checks that must pass in the same run first (performance credit needs correctness).",
    )

    @field_validator("needs")
    @classmethod
    def _known_need(cls, value: str) -> str:
        if not valid_need(value):
            raise ValueError(f"needs {value!r}: use {NEEDS_TEXT}")
        return value


class ReportFigure(_Strict):
    """A number the report must carry in its ```yaml figures block, and how the grader checks it."""

    name: str = Field(pattern=r"^[a-z0-9_]+$", description="Its key in the report's figures block.")
    meaning: str = Field(description="What it is, with its unit, as the learner reads it in the message.")
    check: str | None = Field(
        default=None, description="The check that measures the same configuration in the same grade; None: the "
        "figure follows from the lab's fixed configuration (then `expected` holds it).")
    measured: str | None = Field(default=None, description="The figure that check records (its `record` name).")
    compare_with: Literal["value", "target"] = Field(
        default="value", description="The recorded figure's field to compare with: 'value' (the learner's code, "
        "measured by the grader) or 'target' (the grader's own measurement).")
    expected: float | None = Field(default=None, description="The value, when no check measures it (`check` None).")
    factor: float = Field(default=1, ge=1, description="Accepted ratio either side of the grader's figure (1: none).")
    absolute: float = Field(default=0, ge=0, description="Accepted absolute difference (for figures near zero).")
    busy: str | None = Field(
        default=None, description="A figure the same check records: how contended the CPU was while it measured "
        "(>= 1, hardware.cpu_contention). A wall-clock figure the learner took on their own run and the grader "
        "re-took on a busier machine is off by about that much: the tolerance (factor and absolute) grows by it, "
        "at most report_check.BUSY_CAP, on the side `busy_moves` names only.")
    busy_moves: Literal["up", "down"] = Field(
        default="up", description="Which way a busier machine moves the grader's figure: 'up' for a time or a "
        "cost, 'down' for a rate (tokens or requests per second, goodput); `busy` widens that side only.")
    derived: bool = Field(
        default=False, description="Its check computes it from the block's other figures (a relation such as "
        "T1 / T2), not from a run: `infracourse measure` writes it after those, from that check graded again on "
        "the rewritten block.")

    @model_validator(mode="after")
    def _source(self) -> "ReportFigure":
        if (self.check is None) == (self.expected is None):
            raise ValueError(f"figure {self.name!r}: give either `check` and `measured`, or `expected`")
        if self.check is not None and not self.measured:
            raise ValueError(f"figure {self.name!r}: `check` needs `measured` (the name that check records)")
        if self.busy and self.check is None:
            raise ValueError(f"figure {self.name!r}: `busy` names a figure of `check`, which it lacks")
        return self


class Report(_Strict):
    """The weekly report: its file, the prose a person reads, and the figures the grader compares with its own.

    A Report is os.PathLike (its `file`), so `folder / lab.report` is the report's path."""

    file: str = Field(description="The report file among the lab's `files`.")
    prose: list[str] = Field(
        default_factory=lambda: ["Question and hypothesis", "Workload", "Method", "Correctness criterion",
                                 "Conclusion and limits"],
        description="Sections that must hold the learner's own words (not empty, not the template's text).")
    figures: list[ReportFigure] = Field(
        default_factory=list, description="Figures the report's ```yaml figures block must carry.")

    @model_validator(mode="before")
    @classmethod
    def _file_only(cls, data: object) -> object:
        return {"file": data} if isinstance(data, str) else data  # `report: report.md`: no figures asked for

    @model_validator(mode="after")
    def _unique(self) -> "Report":
        names = [f.name for f in self.figures]
        if len(set(names)) != len(names):
            raise ValueError(f"report figures repeat: {sorted({n for n in names if names.count(n) > 1})}")
        return self

    def __fspath__(self) -> str:
        return self.file

    def __str__(self) -> str:
        return self.file


class RubricItem(_Strict):
    """One item an instructor scores by hand in `infracourse cohort review`: the reasoning no check grades."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Stable id: scores in the gradebook refer to it.")
    title: str = Field(description="What the reviewer judges, in one line.")
    section: str = Field(description="The report section (one of `report.prose`) the reviewer reads for it.")
    criterion: str | None = Field(default=None, description="The course completion criterion (an id of the "
                                  "syllabus' `completion`) this item gives evidence of.")
    week: str | None = Field(default=None, pattern=r"^week2[2-4]$", description="A track project's item: the project "
                             "week (week22..24) from which it is scored; earlier project weeks leave it out.")
    levels: dict[int, str] = Field(description="points -> what earns them, lowest first; 2 to 10 levels, so the "
                                   "reviewer's number keys 0-9 pick one.")

    @field_validator("levels")
    @classmethod
    def _levels(cls, value: dict[int, str]) -> dict[int, str]:
        if not 2 <= len(value) <= 10 or min(value) != 0:
            raise ValueError(f"levels {sorted(value)}: give 2 to 10 levels, the lowest worth 0 points")
        if any(not text.strip() for text in value.values()):
            raise ValueError("a level has no description; say what earns it")
        return dict(sorted(value.items()))

    @property
    def max_points(self) -> int:
        return max(self.levels)


class Lab(_Strict):
    format_version: Literal[1]
    week: str
    title: str
    files: list[str] = Field(min_length=1, description="Files the learner edits; starter/ and solution/ hold each.")
    read: list[str] = Field(default_factory=lambda: ["README.md"], description="What to read first.")
    kit: list[str] = Field(default_factory=list, description="The course kit modules (`gpt` for infracourse.kit."
                           "gpt) the handout names for this lab: in a grade the sandbox mounts no other, so a later "
                           "week's engine cannot answer this one (the graders' own probes are added by the engine).")
    generated: list[str] = Field(default_factory=list, description="What the learner's own scripts write (a "
                                 "file, or a folder ending in /): the solution ships it, the starter cannot.")
    hints: list[str] = Field(min_length=1, description="Progressive hints, gentlest first.")
    checks: list[Check] = Field(min_length=1)
    report: Report | None = Field(default=None, description="The report, if the lab asks for one: its file alone "
                                  "(`report: report.md`) or a mapping (see Report).")
    rubric: list[RubricItem] = Field(default_factory=list, description="What an instructor scores by hand in "
                                     "`cohort review` (needs `report`: each item names one of its sections).")
    later: list[str] = Field(default_factory=list, description="Set by the engine, never in lab.yaml: checks of a "
                             "track project that a later project week grades (their grader tests are left out).")

    @field_validator("kit")
    @classmethod
    def _kit_modules(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - kit_modules())
        if unknown:
            raise ValueError(f"kit names {unknown}, not modules of infracourse/kit/; use some of "
                             f"{sorted(kit_modules())}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Lab":
        ids = [c.id for c in self.checks]
        if len(set(ids)) != len(ids):
            raise ValueError(f"check ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
        for check in self.checks:
            unknown = set(check.requires) - set(ids)
            if unknown:
                raise ValueError(f"check {check.id!r} requires unknown checks {sorted(unknown)}")
        if self.report is not None and self.report.file not in self.files:
            raise ValueError(f"report {self.report.file!r} must also be listed in files")
        rubric_ids = [item.id for item in self.rubric]
        if len(set(rubric_ids)) != len(rubric_ids):
            raise ValueError(f"rubric ids repeat: {sorted({i for i in rubric_ids if rubric_ids.count(i) > 1})}")
        for item in self.rubric:
            # a track's lab.yaml (week 'track-...'), or that lab staged as one of its project weeks (course.py)
            if item.week is not None and not (self.week.startswith("track-") or self.week in PROJECT_WEEKS):
                raise ValueError(f"rubric item {item.id!r} names week {item.week!r}: only a track project's items "
                                 "do (weeks 22-24 grade it in stages); leave it out")
            if self.report is None or item.section not in self.report.prose:
                raise ValueError(f"rubric item {item.id!r} names section {item.section!r}; use one of the report's "
                                 f"prose sections {self.report.prose if self.report else '(no report: add one)'}")
        for figure in self.report.figures if self.report else []:
            if figure.check is not None and figure.check not in ids:
                raise ValueError(f"report figure {figure.name!r} names unknown check {figure.check!r}")
        return self

    def check(self, check_id: str) -> Check:
        for check in self.checks:
            if check.id == check_id:
                return check
        raise KeyError(check_id)


# ---------------------------------------------------------------- loading
# libyaml parses the 47 kB syllabus in ~3 ms where the pure-Python parser takes ~40 ms (most of `status`'s
# start-up); a file that does not parse is read again by the pure-Python parser, whose message quotes the line.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CourseFileError(f"{path}: file not found") from None
    try:
        return yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError:
        pass  # read again below for the message
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CourseFileError(f"{path}: not valid YAML ({exc}); fix the indentation or quoting there") from None


def _explain(path: Path, exc: ValidationError) -> CourseFileError:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return CourseFileError(f"{path}: {len(lines)} problem(s); fix each entry named:\n" + "\n".join(lines))


def load_syllabus(path: Path) -> Syllabus:
    try:
        return Syllabus.model_validate(_read_yaml(path))
    except ValidationError as exc:
        raise _explain(path, exc) from None


def load_lab(path: Path) -> Lab:
    try:
        return Lab.model_validate(_read_yaml(path))
    except ValidationError as exc:
        raise _explain(path, exc) from None


def load_track(path: Path) -> Track:
    try:
        track = Track.model_validate(_read_yaml(path))
    except ValidationError as exc:
        raise _explain(path, exc) from None
    if track.id != path.stem:
        raise CourseFileError(f"{path}: id is {track.id!r}; name the file {track.id}.yaml or change the id")
    return track
