"""The weekly report (report.md): its sections, what a template's placeholder looks like, and the environment stamp.

Every lab's report follows the weekly loop of the syllabus (§8 of the outline): question and hypothesis,
environment, workload, method (warm-up, repetitions, timing and synchronisation), correctness criterion,
results with raw data, conclusion and limits. The report check (grading.report_check, configured by each
lab.yaml's `report:`) reads its sections with `sections`; `infracourse report weekNN` writes this machine's
facts into it with `stamp_environment`.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from infracourse.grading.project_files import PROJECT_BLOCK, pin_lock, read_project
from infracourse.failures import LabCheckFailed
from infracourse.hardware import Hardware

SECTIONS = (
    "Question and hypothesis",
    "Environment",
    "Workload",
    "Method",
    "Correctness criterion",
    "Results",
    "Conclusion and limits",
)
PLACEHOLDER = re.compile(r"\bTODO\b|<fill[^>]*>", re.IGNORECASE)


def sections(text: str) -> dict[str, str]:
    """Map each '## Heading' to the text under it (up to the next '## ')."""
    found: dict[str, str] = {}
    parts = re.split(r"^##\s+(.+?)\s*$", text, flags=re.MULTILINE)
    for heading, body in zip(parts[1::2], parts[2::2]):
        found[heading.strip()] = body.strip()
    return found


def words(text: str) -> list[str]:
    """The words of a section, without TODO markers: a template with its TODOs deleted is still the template."""
    return [w for w in re.findall(r"\w+", text.lower()) if w != "todo"]


def code_commit(folder: Path) -> str:
    """The git commit the folder's files are at (+ ' with uncommitted changes'), or why there is none: 003 §8
    asks every weekly result to name the code it came from."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0:
            return "not in a git repository (`git init` and commit your work to stamp its commit)"
        dirty = git("status", "--porcelain", "--", ".").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not found)"
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def environment_lines(hardware: Hardware, folder: Path | None = None) -> str:
    return "\n".join([*([f"- code commit: {code_commit(folder)}"] if folder is not None else []),
        f"- device: {hardware.device_name}",
        f"- tier: {hardware.tier}",
        f"- python: {hardware.python}",
        f"- torch: {hardware.torch}",
        f"- triton: {hardware.triton}",
        f"- cuda: {hardware.cuda or 'none'}",
        f"- driver: {hardware.driver or 'none'}",
    ])


def stamp_environment(path: Path, hardware: Hardware) -> None:
    """Replace the body of '## Environment' with this machine's facts and the code's commit (the rest is the
    learner's); a project's lock file gets this machine's versions of the packages it pins."""
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(r"(^##\s+Environment\s*$)(.*?)(?=^##\s|\Z)", re.MULTILINE | re.DOTALL)
    if not pattern.search(text):
        raise LabCheckFailed(f"{path.name} has no '## Environment' section to stamp: restore the template's headings")
    lines = environment_lines(hardware, path.parent)
    stamped = pattern.sub(lambda m: m.group(1) + "\n" + lines + "\n\n", text, count=1)
    path.write_text(stamped, encoding="utf-8")
    if PROJECT_BLOCK.search(stamped):  # a direction project: its lock file gets this machine's versions too
        try:
            lock = read_project(stamped, path.name).lock
        except LabCheckFailed:
            return  # the project check says what is wrong with the block
        pin_lock(path.parent / lock)
