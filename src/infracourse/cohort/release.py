"""`infracourse release`: a learner copy of the course repository with no reference solution in it.

What the copy holds: the files git tracks (as they are in the working tree; without git, every file but
caches and build output), less:
  1. every `labs/*/solution/` file;
  2. test files (`tests/**/test_*.py`) that hold a solution: the instructor's proofs of the graders quote
     the reference code to build wrong variants from it. Each is listed in RELEASE.json with its reason;
  3. the honest solutions the proofs grade (any file below a `tests/` folder named `honest`, `*-honest` or
     `*-handout`, the last written from the handout alone): whole working answers in other styles than the
     reference, which no content check would recognise.
Anything else that holds a solution stops the release with an error naming the file and the line.
"Holds a solution" is checked by content, whatever the file is called:
  - whole files: the sha256 of every solution file (unless the starter has the same bytes: not a secret);
  - lines: a solution line of MIN_LINE or more characters that appears in none of the course material
    learners get anyway (labs/ outside solution/, graders/, curriculum/, src/).
`check_release` repeats those checks on a finished copy; `release` runs it before the copy appears.
The copy carries RELEASE.json at its top: the engine's tests skip what needs a solution when it is there
(tests/conftest.py), so the copy installs and its test suite passes with the same two README commands.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from infracourse import __version__

MARKER = "RELEASE.json"
MIN_LINE = 32  # shorter lines are too often generic (`t1 = time.perf_counter()`) to prove a leak
COURSE_MATERIAL = ("labs/", "graders/", "curriculum/", "src/")
NOT_SHIPPED = {".git", "__pycache__", ".pytest_cache", ".venv", "build", "dist", ".ipynb_checkpoints"}


class ReleaseError(Exception):
    """The release cannot be made; the message names the file and the fix."""


@dataclass
class ReleaseReport:
    out: Path
    files: int
    removed: list[dict] = field(default_factory=list)  # {"path", "reason"}


@dataclass(frozen=True)
class Secrets:
    """What of the reference solutions must not reach learners."""

    hashes: dict[str, str]  # sha256 -> the solution file with those bytes
    lines: dict[str, str]  # stripped line -> the solution file it comes from
    # the lines by their first MIN_LINE characters, for _quoted (every line has at least that many)
    by_prefix: dict[str, list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_prefix", _by_prefix(self.lines))


def release(course_root: Path, out_dir: Path) -> ReleaseReport:
    """Write the learner copy of `course_root` into `out_dir` (new or empty); checked before it appears."""
    root, out = Path(course_root).resolve(), Path(out_dir).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out} exists and is not empty: choose a new folder for the release")
    if out == root or root in out.parents:
        raise ReleaseError(f"{out} is inside the course folder {root}: choose a folder outside it")
    shipped = _repository_files(root)
    secrets = find_secrets(root, shipped)
    part = out.with_name(f".{out.name}.part")
    shutil.rmtree(part, ignore_errors=True)
    removed = []
    for rel in shipped:
        reason, evidence = ("a reference solution", "") if _is_solution_path(rel) else \
            ("an honest solution the graders' proofs grade", "") if is_honest_solution(rel) else \
            _leak((root / rel).read_bytes(), secrets)
        if reason and not (_is_test(rel) or _is_solution_path(rel) or is_honest_solution(rel)):
            shutil.rmtree(part, ignore_errors=True)
            raise ReleaseError(f"{root / rel}: {reason}{evidence}; a learner copy must not show it: remove the "
                               "solution code from this file (or move the file under tests/ if it is the graders' "
                               "proof)")
        if reason:
            removed.append({"path": rel, "reason": reason})  # no evidence: RELEASE.json ships to learners
            continue
        (part / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, part / rel)
    (part / MARKER).write_text(json.dumps({
        "format_version": 1, "kind": "infracourse-learner-release", "infracourse_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "source_commit": _head(root),
        "removed": removed}, indent=1) + "\n")
    problems = check_release(part, root, secrets)
    if problems:
        shutil.rmtree(part, ignore_errors=True)
        raise ReleaseError("the learner copy still holds solutions:\n  " + "\n  ".join(problems))
    if out.exists():
        out.rmdir()  # an empty folder, checked above: the finished copy takes its place
    part.rename(out)
    return ReleaseReport(out=out, files=len(shipped) - len(removed) + 1, removed=removed)


def check_release(release_dir: Path, course_root: Path, secrets: Secrets | None = None) -> list[str]:
    """Problems that make `release_dir` unfit for learners (empty when it holds no solution). `secrets`: the
    course's, when the caller has just found them (release); else found here."""
    release_dir = Path(release_dir)
    problems = [] if (release_dir / MARKER).is_file() else [f"{release_dir}: no {MARKER}"]
    problems += [f"{p}: a reference solution folder" for p in sorted(release_dir.glob("labs/*/solution"))]
    root = Path(course_root).resolve()
    secrets = secrets if secrets is not None else find_secrets(root, _repository_files(root))
    for path in sorted(p for p in release_dir.rglob("*") if p.is_file()):
        reason, evidence = _leak(path.read_bytes(), secrets)
        if reason:
            problems.append(f"{path}: {reason}{evidence}")
    return problems


def find_secrets(root: Path, shipped: list[str]) -> Secrets:
    """Solution files' bytes, and the solution lines a learner would otherwise never see."""
    hashes, lines = {}, {}
    solutions = sorted(p for p in root.glob("labs/*/solution/**/*") if p.is_file() and "__pycache__" not in p.parts)
    for path in solutions:
        data, parts = path.read_bytes(), path.relative_to(root).parts  # labs, <lab>, solution, <name...>
        rel, starter = "/".join(parts), root.joinpath(parts[0], parts[1], "starter", *parts[3:])
        if not (starter.is_file() and starter.read_bytes() == data):
            hashes[hashlib.sha256(data).hexdigest()] = rel
        given = "\n".join(_text(p) for p in root.joinpath(parts[0], parts[1]).rglob("*")
                          if p.is_file() and "solution" not in p.relative_to(root).parts[2:3])
        for line in _lines(data):
            if line not in given:  # the starter, handout or lab.yaml hints already show it
                lines.setdefault(line, rel)
    public = "\n".join(_text(root / rel) for rel in shipped
                       if rel.startswith(COURSE_MATERIAL) and not _is_solution_path(rel))
    shown = _quoted(public, _by_prefix(lines))
    return Secrets(hashes, {line: rel for line, rel in lines.items() if line not in shown})


def _leak(data: bytes, secrets: Secrets) -> tuple[str, str]:
    """(why these bytes hold a solution, the line that shows it); ('', '') when they do not."""
    same = secrets.hashes.get(hashlib.sha256(data).hexdigest())
    if same:
        return f"the same bytes as {same}", ""
    quoted = _quoted(_text_of(data), secrets.by_prefix)
    for line, source in secrets.lines.items():  # the first in the secrets' order, as `line in text` for each
        if line in quoted:
            return f"quotes {source}", f": {line[:80]!r}"
    return "", ""


def _by_prefix(lines) -> dict[str, list[str]]:
    """`lines` (each MIN_LINE characters or more, as _lines keeps them) by their first MIN_LINE characters."""
    index: dict[str, list[str]] = {}
    for line in lines:
        index.setdefault(line[:MIN_LINE], []).append(line)
    return index


def _quoted(text: str, by_prefix: dict[str, list[str]]) -> set[str]:
    """The lines of `by_prefix` that `text` contains anywhere (as `line in text`), found in one pass over the text:
    only a line whose first MIN_LINE characters start at a position is compared there. (Each line searched for in
    the whole text took a release 80 s: 6000 solution lines against 5 MB of course files.)"""
    found: set[str] = set()
    if not by_prefix:
        return found
    get = by_prefix.get
    for i in range(len(text) - MIN_LINE + 1):
        bucket = get(text[i:i + MIN_LINE])
        if bucket:
            found.update(line for line in bucket if text.startswith(line, i))
    return found


def _text(path: Path) -> str:
    return _text_of(path.read_bytes())


def _text_of(data: bytes) -> str:
    """A file's text ('' for a binary file: whole-file hashes cover those)."""
    return "" if b"\0" in data[:8192] else data.decode("utf-8", errors="replace")


def _lines(data: bytes) -> list[str]:
    """Lines long and wordy enough to identify their file (not a table rule or a closing bracket run)."""
    stripped = (line.strip() for line in _text_of(data).splitlines())
    return [line for line in stripped if len(line) >= MIN_LINE and sum(map(str.isalnum, line)) >= MIN_LINE // 2]


def _is_solution_path(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) > 3 and parts[0] == "labs" and parts[2] == "solution"


def is_honest_solution(rel: str) -> bool:
    """A file of tests/**/honest/**, tests/**/*-honest/** or tests/**/*-handout/** (written from the handout
    alone): a learner's answer written for a lab proof."""
    parts = rel.split("/")
    return parts[0] == "tests" and any(p == "honest" or p.endswith(("-honest", "-handout")) for p in parts[1:-1])


def _is_test(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return rel.startswith("tests/") and name.startswith("test_") and name.endswith(".py")


def _repository_files(root: Path) -> list[str]:
    tracked = _tracked(root)
    if tracked is not None:
        return sorted(rel for rel in tracked if (root / rel).is_file() and not (root / rel).is_symlink())
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in NOT_SHIPPED and not d.endswith(".egg-info"))
        found += [(Path(dirpath) / n).relative_to(root).as_posix() for n in filenames if not n.endswith(".pyc")]
    return sorted(found)


def _tracked(root: Path) -> list[str] | None:
    """The files git tracks under root (None when root is not in a git checkout)."""
    try:
        done = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return [p for p in done.stdout.decode().split("\0") if p]


def _head(root: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None
