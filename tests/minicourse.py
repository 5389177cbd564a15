"""A one-week course made on the fly from the fixture course, for engine tests that need their own checks."""
from __future__ import annotations

import shutil
from pathlib import Path

from infracourse.course import Course

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "course"


def make_course(root: Path, checks_yaml: str, graders: str, first_check: str) -> Course:
    """The fixture course with week01's lab.yaml checks replaced by `checks_yaml` and its graders by the
    single file `graders` (acceptance points at `first_check`)."""
    shutil.copytree(FIXTURE, root)
    lab = root / "labs" / "week01-probe" / "lab.yaml"
    lab.write_text("format_version: 1\nweek: week01\ntitle: \"made for a test\"\nfiles: [probe.py]\n"
                   "hints: [\"see the test\"]\nchecks:\n" + checks_yaml)
    folder = root / "graders" / "week01"
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / "test_made.py").write_text(graders)
    syllabus = root / "curriculum" / "syllabus.yaml"
    syllabus.write_text(syllabus.read_text().replace("checks: [answers]", f"checks: [{first_check}]"))
    return Course(root)
