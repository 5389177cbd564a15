"""`infracourse watch`: regrade on every save, like rustlings.

The loop is a plain function over injected parts (what a folder looks like now, how to grade, how to show,
how to wait) so tests drive it step by step with no sleeping. The folder's stamp is taken *before* each
grade: a save made while grading differs from it, so the loop grades again right after (a stamp taken after
the grade would swallow that save). Files the tool or Python write are not the learner's saves: they are
left out of the stamp.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

# Generated, not saved by the learner: the tool's own output, Python caches, backups, editors' temporary files.
IGNORED_DIRS = {".grade", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", ".mypy_cache", ".ruff_cache"}
IGNORED_SUFFIXES = (".pyc", ".pyo", ".swp", ".swo", ".swx", "~", ".tmp")
IGNORED_PREFIXES = (".backup-", ".#")


def generated(relative: Path) -> bool:
    """True for a path (relative to the week folder) that no learner save produced."""
    if any(part in IGNORED_DIRS or part.startswith(IGNORED_PREFIXES) for part in relative.parts):
        return True
    return relative.name.endswith(IGNORED_SUFFIXES) or relative.name == "4913"  # vim's write probe


def folder_stamp(folder: Path) -> tuple:
    """A value that changes whenever the learner saves, adds or deletes a file in the folder."""
    stamp = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if generated(relative):
            continue
        try:
            info = path.stat()
        except OSError:  # deleted while we looked: the next look sees it gone
            continue
        if path.is_file():
            stamp.append((str(relative), info.st_mtime_ns, info.st_size))
    return tuple(sorted(stamp))


def watch_loop(folder: Path, grade: Callable[[], object], show: Callable[[object], None], *,
               interval: float = 0.5, stamp: Callable[[Path], tuple] = folder_stamp,
               sleep: Callable[[float], None] = time.sleep, stop: Callable[[], bool] = lambda: False) -> int:
    """Grade now, then again after every save, until `stop()` (or Ctrl-C). Returns how many grades ran."""
    seen = None
    grades = 0
    while not stop():
        now = stamp(folder)
        if now == seen:
            sleep(interval)
            continue
        seen = now  # before grading: a save during the grade makes the next look differ
        show(grade())
        grades += 1
    return grades
