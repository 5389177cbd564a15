"""Where the course content lives, and the one object that reads it.

Authors edit `curriculum/`, `labs/` and `graders/` at the repository top level; a wheel carries them as
`infracourse/_course/`. INFRACOURSE_COURSE points at another course folder (the engine's tests use a tiny one).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from infracourse.syllabus import CourseFileError, Lab, Syllabus, Week, load_lab, load_syllabus

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

    @property
    def starter(self) -> Path:
        return self.path / "starter"

    @property
    def solution(self) -> Path:
        return self.path / "solution"


class Course:
    def __init__(self, root: Path | None = None):
        self.root = (root or default_course_root()).resolve()

    @cached_property
    def syllabus(self) -> Syllabus:
        return load_syllabus(self.root / "curriculum" / "syllabus.yaml")

    def week(self, ref: str | int) -> Week:
        return self.syllabus.week(ref)

    def lab(self, ref: str | int | Week) -> LabDir:
        week = ref if isinstance(ref, Week) else self.week(ref)
        if week.planned:
            raise CourseFileError(f"{week.id} ({week.title}) has no lab yet: it is planned")
        path = self.root / "labs" / week.lab
        spec = load_lab(path / "lab.yaml")
        if spec.week != week.id:
            raise CourseFileError(f"{path / 'lab.yaml'}: week is {spec.week!r} but the syllabus maps it to {week.id}")
        return LabDir(path=path, spec=spec, graders=self.root / "graders" / week.id)

    def labs(self) -> list[LabDir]:
        return [self.lab(w) for w in self.syllabus.weeks if not w.planned]
