"""Where the course content lives, and the one object that reads it.

Authors edit `curriculum/`, `labs/` and `graders/` at the repository top level; a wheel carries them as
`infracourse/_course/`. INFRACOURSE_COURSE points at another course folder (the engine's tests use a tiny one).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from infracourse.syllabus import CourseFileError, Lab, Syllabus, Track, Week, load_lab, load_syllabus, load_track

PACKAGE_DIR = Path(__file__).resolve().parent


def default_course_root() -> Path:
    if env := os.environ.get("INFRACOURSE_COURSE"):
        return Path(env).resolve()
    shipped = PACKAGE_DIR / "_course"
    if (shipped / "curriculum").is_dir():
        return shipped
    checkout = PACKAGE_DIR.parent.parent  # src/infracourse -> repository root (editable install)
    if (checkout / "curriculum").is_dir():
        return checkout
    raise CourseFileError(
        f"no course content found: looked in {shipped} and {checkout}; reinstall infracourse "
        "or set INFRACOURSE_COURSE to a folder holding curriculum/, labs/ and graders/"
    )


@dataclass(frozen=True)
class LabDir:
    """One lab folder: handout, lab.yaml, starter/ and solution/, and its graders folder."""

    path: Path
    spec: Lab
    graders: Path
    track: str | None = None  # the direction whose project this is (weeks 22-24)

    @property
    def starter(self) -> Path:
        return self.path / "starter"

    @property
    def solution(self) -> Path:
        return self.path / "solution"


class NoTrackChosen(CourseFileError):
    """A project week (22-24) was asked for before the learner chose a track."""


class Course:
    def __init__(self, root: Path | None = None, track: str | None = None):
        self.root = (root or default_course_root()).resolve()
        self.track_id = track  # the learner's direction for weeks 22-24 (workspace config), if chosen

    @cached_property
    def syllabus(self) -> Syllabus:
        return load_syllabus(self.root / "curriculum" / "syllabus.yaml")

    def week(self, ref: str | int) -> Week:
        return self.syllabus.week(ref)

    @cached_property
    def tracks(self) -> dict[str, Track]:
        folder = self.root / "curriculum" / "tracks"
        return {t.id: t for t in (load_track(p) for p in sorted(folder.glob("*.yaml")))} if folder.is_dir() else {}

    def track(self, track_id: str | None = None) -> Track:
        wanted = track_id or self.track_id
        if wanted is None:
            raise NoTrackChosen("weeks 22-24 are the project of the track you choose: see them with `infracourse "
                                f"track list`, then `infracourse track choose NAME` ({', '.join(self.tracks)})")
        if wanted not in self.tracks:
            raise CourseFileError(f"no track {wanted!r}: the course has {', '.join(self.tracks) or 'none'} "
                                  "(curriculum/tracks/*.yaml); choose one of them with `infracourse track choose`")
        return self.tracks[wanted]

    def lab(self, ref: str | int | Week, track: str | None = None) -> LabDir:
        """The lab of a week; for a project week, the chosen (or given) track's project, holding the checks
        graded up to that week."""
        week = ref if isinstance(ref, Week) else self.week(ref)
        if week.planned:
            raise CourseFileError(f"{week.id} ({week.title}) has no lab yet: it is planned")
        if week.on_track:
            return self._project(week, self.track(track))
        path = self.root / "labs" / week.lab
        spec = load_lab(path / "lab.yaml")
        if spec.week != week.id:
            raise CourseFileError(f"{path / 'lab.yaml'}: week is {spec.week!r} but the syllabus maps it to {week.id}")
        return LabDir(path=path, spec=spec, graders=self.root / "graders" / week.id)

    def _project(self, week: Week, track: Track) -> LabDir:
        path = self.root / "labs" / track.lab
        spec = load_lab(path / "lab.yaml")
        if spec.week != track.lab:
            raise CourseFileError(f"{path / 'lab.yaml'}: week is {spec.week!r}; a track's project names its folder "
                                  f"({track.lab!r})")
        known = {c.id for c in spec.checks}
        listed = [c for checks in track.weeks.values() for c in checks]
        if set(listed) != known or len(listed) != len(known):
            raise CourseFileError(f"curriculum/tracks/{track.id}.yaml: its weeks must list each check of "
                                  f"{path / 'lab.yaml'} exactly once (unlisted: {sorted(known - set(listed))}, "
                                  f"unknown or repeated: {sorted({c for c in listed if c not in known or listed.count(c) > 1})})")
        now = set(track.checks_until(week.id))
        report = spec.report
        if report is not None:  # figures measured by a later week's check are asked for in that week
            report = report.model_copy(update={"figures": [f for f in report.figures if f.check is None or f.check in now]})
        rubric = [item for item in spec.rubric if item.week is None or item.week <= week.id]  # scored from its week
        staged = spec.model_copy(update={"week": week.id, "checks": [c for c in spec.checks if c.id in now],
                                         "later": sorted(known - now), "report": report, "rubric": rubric})
        return LabDir(path=path, spec=staged, graders=self.root / "graders" / track.lab, track=track.id)

    def acceptance(self, week: Week, track: str | None = None) -> list[tuple[str, list[str]]]:
        """(criterion, checks enforcing it) of a week; a project week adds the track's own checks to the generic
        project checks the syllabus names."""
        extra = self.track(track).acceptance.get(week.id, []) if week.on_track else []
        if extra and len(extra) != len(week.acceptance):
            raise CourseFileError(f"curriculum/tracks/{self.track(track).id}.yaml: acceptance of {week.id} has "
                                  f"{len(extra)} entries; the syllabus has {len(week.acceptance)} criteria")
        return [(c.text, [*c.checks, *(extra[i] if extra else [])]) for i, c in enumerate(week.acceptance)]

    def labs(self) -> list[LabDir]:
        """Every built week's lab (the project weeks with the chosen track's project, when one is chosen)."""
        return [self.lab(w) for w in self.syllabus.weeks
                if not w.planned and (not w.on_track or self.track_id is not None)]
