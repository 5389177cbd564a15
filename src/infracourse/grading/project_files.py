"""A direction project's own files, as its report names them: the ```yaml project block of report.md (`Project`,
`read_project`) and the lock file it points to (`read_lock`, `check_lock`, `pin_lock`).

Read by the project checks (grading.project) and by `infracourse report` (grading.report.stamp_environment
pins the lock to this machine's versions). The block's keys are documented in grading.project.
"""
from __future__ import annotations

import platform
import re
import shlex
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import yaml

from infracourse.failures import LabCheckFailed

PROJECT_BLOCK = re.compile(r"^```[ \t]*(?:ya?ml[ \t]+)?project[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
REQUIRED_PINS = ("torch", "numpy")


@dataclass
class Project:
    """The report's project block, read and validated."""

    run: list[str]  # ["python", SCRIPT, ARGS...]
    lock: str
    raw_data: list[str]
    evidence: list[str]
    failure_cases: list[str]
    to_be_verified: list[str] = field(default_factory=list)

    @property
    def script(self) -> str:
        return self.run[1]


def read_project(text: str, name: str) -> Project:
    """The project block of a report; fails, naming the fix, when it is missing or malformed."""
    blocks = PROJECT_BLOCK.findall(text)
    if len(blocks) != 1:
        raise LabCheckFailed(f"{name} has {len(blocks) or 'no'} ```yaml project block(s): keep exactly one, with "
                             "run, lock, raw_data, evidence, failure_cases and to_be_verified (the template shows it)")
    try:
        data = yaml.safe_load(blocks[0]) or {}
    except yaml.YAMLError as exc:
        raise LabCheckFailed(f"{name}: the project block is not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise LabCheckFailed(f"{name}: the project block must be `key: value` lines")
    unknown = set(data) - {"run", "lock", "raw_data", "evidence", "failure_cases", "to_be_verified"}
    if unknown:
        raise LabCheckFailed(f"{name}: the project block has unknown keys {sorted(unknown)}")

    def paths(key: str, required: bool = True) -> list[str]:
        value = data.get(key) or []
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise LabCheckFailed(f"{name}: project `{key}` must be a list of paths")
        if required and not value:
            raise LabCheckFailed(f"{name}: project `{key}` is empty: name the file(s) your run writes")
        for v in value:
            if Path(v).is_absolute() or ".." in Path(v).parts:
                raise LabCheckFailed(f"{name}: project `{key}` entry {v!r} must be a path inside the project")
        return list(value)

    run = data.get("run")
    words = shlex.split(run) if isinstance(run, str) else []
    if len(words) < 2 or words[0] not in ("python", "python3") or not words[1].endswith(".py"):
        raise LabCheckFailed(f"{name}: project `run` is {run!r}; write the one command as `python SCRIPT.py ARGS` "
                             "(the grader runs it from a clean copy of your project)")
    lock = data.get("lock")
    if not isinstance(lock, str) or not lock.strip():
        raise LabCheckFailed(f"{name}: project `lock` must name your lock file (name==version lines)")
    to_verify = data.get("to_be_verified") or []
    if not isinstance(to_verify, list) or not all(isinstance(v, str) for v in to_verify):
        raise LabCheckFailed(f"{name}: project `to_be_verified` must be a list of check ids (empty: [])")
    return Project(run=words, lock=lock, raw_data=paths("raw_data"), evidence=paths("evidence"),
                   failure_cases=paths("failure_cases"), to_be_verified=list(to_verify))


# ------------------------------------------------------------------ the lock file
def read_lock(text: str, name: str) -> dict[str, str]:
    """name -> pinned version; every requirement line must pin one version with ==."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue  # comments, pip options (--index-url ...)
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;,]+)", line)
        if not match:
            raise LabCheckFailed(f"{name} line {number} ({line!r}) does not pin one version: write name==version "
                                 "(a range or a bare name lets another machine install something else)")
        pins[_canonical(match.group(1))] = match.group(3)
    missing = [p for p in REQUIRED_PINS if p not in pins]
    if missing:
        raise LabCheckFailed(f"{name} pins no {missing}: the packages every run of the project imports must be pinned")
    return pins


def installed_version(package: str) -> str | None:
    if package == "python":
        return platform.python_version()
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def version_matches(pinned: str, installed: str) -> bool:
    """pip's ==: a pin without a local label ('2.13.0') matches '2.13.0+cpu'; 'python==3.11' matches 3.11.7."""
    if pinned == installed or pinned == installed.split("+", 1)[0]:
        return True
    return bool(re.fullmatch(r"\d+\.\d+", pinned)) and installed.startswith(pinned + ".")


def check_lock(path: Path) -> dict[str, str]:
    """The lock's pins, each equal to what is installed where this grade runs; fails naming every mismatch."""
    if not path.is_file():
        raise LabCheckFailed(f"{path.name} (the report's project `lock`) is missing: write name==version lines for "
                             "the packages the project imports (`infracourse report` fills in this machine's)")
    pins = read_lock(path.read_text(encoding="utf-8"), path.name)
    wrong = [f"{name}=={pin} but {installed or 'not installed'} here" for name, pin in pins.items()
             for installed in [installed_version(name)] if installed is None or not version_matches(pin, installed)]
    if wrong:
        raise LabCheckFailed(f"{path.name} does not describe the environment that ran: {'; '.join(wrong)}. Pin the "
                             "versions of the machine you measured on (`infracourse report` writes them), and "
                             "re-measure if your figures came from another environment")
    return pins


def pin_lock(path: Path) -> None:
    """Rewrite the lock's pins with this environment's versions (`infracourse report`), keeping its packages."""
    text = path.read_text(encoding="utf-8") if path.exists() else "torch==0\nnumpy==0\n"
    out = []
    for raw in text.splitlines():
        match = re.match(r"^(\s*)([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*[^\s;#,]+(.*)$", raw)
        version = installed_version(_canonical(match.group(2))) if match else None
        out.append(f"{match.group(1)}{match.group(2)}{match.group(3) or ''}=={version}{match.group(4)}"
                   if match and version else raw)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
