"""The weekly report (report.md): its sections, the check that it is filled, and the environment stamp.

Every lab's report follows the weekly loop of the syllabus (§8 of the outline): question and hypothesis,
environment, workload, method (warm-up, repetitions, timing and synchronisation), correctness criterion,
results with raw data, conclusion and limits. A report is checked for being filled in and for agreeing
with the machine it is graded on; `infracourse report weekNN` writes this machine's facts into it.
"""
from __future__ import annotations

import re
from pathlib import Path

from infracourse.guard import LabCheckFailed
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


def environment_lines(hardware: Hardware) -> str:
    return "\n".join([
        f"- device: {hardware.device_name}",
        f"- tier: {hardware.tier}",
        f"- python: {hardware.python}",
        f"- torch: {hardware.torch}",
        f"- triton: {hardware.triton}",
        f"- cuda: {hardware.cuda or 'none'}",
        f"- driver: {hardware.driver or 'none'}",
    ])


def stamp_environment(path: Path, hardware: Hardware) -> None:
    """Replace the body of '## Environment' with this machine's facts (the rest is the learner's)."""
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(r"(^##\s+Environment\s*$)(.*?)(?=^##\s|\Z)", re.MULTILINE | re.DOTALL)
    if not pattern.search(text):
        raise LabCheckFailed(f"{path.name} has no '## Environment' section to stamp: restore the template's headings")
    stamped = pattern.sub(lambda m: m.group(1) + "\n" + environment_lines(hardware) + "\n\n", text, count=1)
    path.write_text(stamped, encoding="utf-8")


Rule = tuple[str, str]  # (regex, what the section must state)
# What every timed lab's Method section must say (the device-programming block's acceptance asks for it).
SYNC_STATED: Rule = (r"synchroni[sz]e|cuda\.Event|elapsed_time|do_bench|measure\(",
                     "how the device is synchronised around the timed region (events, torch.cuda.synchronize, ...)")


def check_report(path: Path, hardware: Hardware, *, required: dict[str, Rule | list[Rule]] | None = None) -> dict:
    """Fail unless every section is filled, the environment is this machine's, and each `required` rule
    (section -> one (regex, meaning) or a list of them) is met. Returns the sections."""
    if not path.exists():
        raise LabCheckFailed(f"{path.name} is missing: copy the template back with `infracourse reset` and fill it")
    found = sections(path.read_text(encoding="utf-8"))
    missing = [s for s in SECTIONS if s not in found]
    if missing:
        raise LabCheckFailed(f"{path.name} lacks the section(s) {missing}: keep the template's '## ' headings")
    empty = [s for s in SECTIONS if len(found[s]) < 20 or PLACEHOLDER.search(found[s])]
    if empty:
        raise LabCheckFailed(f"{path.name}: fill in {empty} (each needs real content, with no TODO left)")
    env = found["Environment"]
    for label, value in (("torch", hardware.torch), ("device", hardware.device_name)):
        if value and value not in env:
            raise LabCheckFailed(
                f"{path.name}: the Environment section does not state this machine's {label} ({value}); the numbers "
                "must come from the machine you grade on. Run `infracourse report <week>` to stamp it, then "
                "re-measure if your figures came from elsewhere")
    for section, rules in (required or {}).items():
        for pattern, meaning in [rules] if isinstance(rules, tuple) else rules:
            if not re.search(pattern, found[section], re.IGNORECASE | re.MULTILINE):
                raise LabCheckFailed(f"{path.name}: the {section} section must state {meaning}")
    return found
