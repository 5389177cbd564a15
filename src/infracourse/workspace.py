"""The learner's workspace: where it is, unlocking weeks (copying starters), and resetting them.

Layout: `<root>/.infracourse/config.yaml` (with the chosen `track`) and `progress.db` (+ its backup
`progress.db.bak`); each unlocked week in `<root>/weekNN/`, whose `.grade/` holds what the tool generated
(`result.json`: the last grade, plots). Weeks 22-24 share one folder, `<root>/project/`: the chosen track's
project grows over the three weeks (each week's last grade still lands in `weekNN/.grade/`).
Commands find the workspace like git finds a repository: `--workspace`, then INFRACOURSE_WORKSPACE, then the
current folder and its parents.
"""
from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from infracourse import __version__
from infracourse.course import Course, LabDir
from infracourse.grading.results import GradeResult
from infracourse.progress import Progress
from infracourse.syllabus import Week

MARKER = ".infracourse"
HANDOUT = "README.md"
GENERATED = ".grade"  # per week: files the tool writes (last result, plots); never the learner's work
WEEK_FOLDER = re.compile(r"week\d\d")
PROJECT = "project"  # the folder of the direction project (weeks 22-24)


class WorkspaceError(Exception):
    """No usable workspace; the message says how to make or find one."""


@dataclass
class UnlockReport:
    week: Week
    folder: Path | None
    copied: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # the learner's changed files, left as they are
    newly_unlocked: bool = True


class Workspace:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self.meta = self.root / MARKER
        if not (self.meta / "config.yaml").is_file():
            raise WorkspaceError(f"{self.root} is not an infracourse workspace: run `infracourse init {self.root}`")
        self.progress = Progress(self.meta / "progress.db", must_exist=True)
        if self.progress.lost:
            self._rebuild()

    def _rebuild(self) -> None:
        """The database was lost with no backup: unlocks come back from the week folders, and each week's last
        grade from its .grade/result.json. What cannot come back is said in progress.notice."""
        weeks = sorted(p.name for p in self.root.iterdir() if p.is_dir() and WEEK_FOLDER.fullmatch(p.name))
        if (self.root / PROJECT).is_dir() and "week22" not in weeks:
            weeks.append("week22")  # the project was started; later project weeks come back from their grades
        grades = 0
        for week in weeks:
            self.progress.unlock(week)
            saved = self.root / week / GENERATED / "result.json"
            try:
                result = GradeResult.from_dict(json.loads(saved.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            self.progress.record(result)
            grades += 1
        self.progress.notice += (f"; rebuilt {len(weeks)} unlock(s) from the week folders and {grades} last "
                                 "grade(s) from weekNN/.grade/result.json; earlier attempts and the count of hints "
                                 "shown are lost")

    @classmethod
    def init(cls, root: Path) -> "Workspace":
        """Create (or reopen) a workspace; an existing one keeps its progress."""
        if root.exists() and not root.is_dir():
            raise WorkspaceError(f"{root} is a file, not a folder: pick a new folder name for the workspace")
        meta = root / MARKER
        meta.mkdir(parents=True, exist_ok=True)
        config = meta / "config.yaml"
        if not config.exists():
            Progress(meta / "progress.db")  # a new workspace starts with an empty database, not a lost one
            config.write_text(yaml.safe_dump({"format_version": 1, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                              "created_by": f"infracourse {__version__}"}))
        return cls(root)

    @classmethod
    def find(cls, explicit: Path | None = None, start: Path | None = None) -> "Workspace":
        if explicit is None and os.environ.get("INFRACOURSE_WORKSPACE"):
            explicit = Path(os.environ["INFRACOURSE_WORKSPACE"])
        if explicit is not None:
            return cls(explicit)
        here = (start or Path.cwd()).resolve()
        for folder in (here, *here.parents):
            if (folder / MARKER / "config.yaml").is_file():
                return cls(folder)
        raise WorkspaceError(f"no infracourse workspace in {here} or above it: run `infracourse init DIR`, then work "
                             "inside DIR (or pass --workspace DIR, or set INFRACOURSE_WORKSPACE)")

    def compile_cache(self, week: Week) -> Path:
        """Where the week's Triton kernels stay compiled between grades (outside the lab folder, so never
        part of a snapshot or a submission)."""
        return self.meta / "cache" / week.id

    def week_dir(self, week: Week) -> Path:
        return self.root / (PROJECT if week.on_track else week.id)

    def week_here(self, cwd: Path | None = None) -> str | None:
        """The week whose folder the current directory is in (`infracourse grade` inside week07/), or None;
        inside project/, the latest project week unlocked."""
        try:
            parts = (cwd or Path.cwd()).resolve().relative_to(self.root).parts
        except ValueError:
            return None
        if parts and parts[0] == PROJECT:
            project = sorted(w for w in self.progress.unlocked() if w in ("week22", "week23", "week24"))
            return project[-1] if project else None
        return parts[0] if parts and WEEK_FOLDER.fullmatch(parts[0]) else None

    # ------------------------------------------------------------ the direction track
    @property
    def track(self) -> str | None:
        """The track chosen for weeks 22-24 (`infracourse track choose`), or None."""
        config = yaml.safe_load((self.meta / "config.yaml").read_text()) or {}
        return config.get("track")

    def choose_track(self, course: Course, track_id: str) -> Path | None:
        """Record the learner's track. A project already started under another track is moved aside to
        project-<old track>/ (returned), never deleted; the new track's starter arrives at the next unlock."""
        course.track(track_id)  # an unknown name fails here, naming the tracks
        path = self.meta / "config.yaml"
        config = yaml.safe_load(path.read_text()) or {}
        old, moved = config.get("track"), None
        if old and old != track_id and (self.root / PROJECT).exists():
            moved = self.root / f"{PROJECT}-{old}"
            if moved.exists():
                moved = self.root / f"{PROJECT}-{old}-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(self.root / PROJECT, moved)
        config["track"] = track_id
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config))
        os.replace(tmp, path)
        course.track_id = track_id
        return moved

    def save_result(self, result: GradeResult) -> None:
        """Keep the last grade beside the week's files too: the database can be rebuilt from these. A partial
        grade is not kept there: result.json stays the last whole grade."""
        if result.partial:
            return
        folder = self.root / result.week / GENERATED
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "result.json.tmp"
        tmp.write_text(json.dumps(result.as_dict(), indent=1))
        os.replace(tmp, folder / "result.json")

    # ------------------------------------------------------------ unlocking
    def unlock(self, course: Course, week: Week) -> UnlockReport:
        """Open a week: copy its starter files and handout, never overwriting a file the learner changed."""
        if week.planned:
            return UnlockReport(week=week, folder=None, newly_unlocked=self.progress.unlock(week.id))
        lab = course.lab(week)  # a project week without a chosen track stops here, still locked
        newly = self.progress.unlock(week.id)
        folder = self.week_dir(week)
        report = UnlockReport(week=week, folder=folder, newly_unlocked=newly)
        for source, name in _lab_files(lab):
            target = folder / name
            if target.exists() and not filecmp.cmp(source, target, shallow=False):
                report.kept.append(name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copy2(source, target)
                report.copied.append(name)
        return report

    def next_week(self, course: Course) -> Week | None:
        """The first week in syllabus order not yet unlocked (None when all are)."""
        unlocked = self.progress.unlocked()
        return next((w for w in course.syllabus.weeks if w.id not in unlocked), None)

    def reset(self, course: Course, week: Week) -> Path | None:
        """Put the starter files back; the learner's versions go to weekNN/.backup-<timestamp>/ first."""
        lab = course.lab(week)
        folder = self.week_dir(week)
        backup = folder / f".backup-{time.strftime('%Y%m%d-%H%M%S')}"
        saved = False
        for source, name in _lab_files(lab):
            target = folder / name
            if target.exists() and not filecmp.cmp(source, target, shallow=False):
                (backup / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(target, backup / name)
                saved = True
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        self.progress.unlock(week.id)
        return backup if saved else None


def _lab_files(lab: LabDir) -> list[tuple[Path, str]]:
    """(source, name in the week folder) for every starter file, and the handout."""
    files = [(p, str(p.relative_to(lab.starter))) for p in sorted(lab.starter.rglob("*")) if p.is_file()
             and "__pycache__" not in p.parts]
    if not (lab.starter / HANDOUT).exists() and (lab.path / HANDOUT).exists():
        files.append((lab.path / HANDOUT, HANDOUT))
    return files
