"""The report check of every lab, configured by the `report:` section of its lab.yaml (syllabus.Report).

A report is graded on what was measured, not on how it is worded:
- prose sections (`report.prose`) must hold the learner's own words: present, not empty, no TODO, and not the
  starter template's text; their wording is never matched against patterns;
- the Environment section must state this machine (the figures must come from the machine graded);
- the figures the lab asks for (`report.figures`) sit in one fenced block, e.g.

      ```yaml figures
      loop_ns_per_element: 23.1
      ```

  and each is compared with the grader's own figure: one that another check of the same grade recorded while
  measuring the same configuration (`check` + `measured`), or one that follows from the lab's fixed
  configuration (`expected`). A figure whose check was blocked here (it needs hardware this machine lacks) may
  be left out and is not compared; one whose check ran but did not pass cannot be checked, so the report fails.

`test_report` is every weekly lab's report check (grading.shared): the grading plugin collects it from here for
each lab whose lab.yaml has a report, beside the week's own graders.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from infracourse.grading.report import PLACEHOLDER, SECTIONS, sections, words
from infracourse.failures import LabCheckFailed
from infracourse.hardware import Hardware
from infracourse.syllabus import Report, ReportFigure

# ```yaml figures  or  ```figures : the block the figures live in (one per report)
FIGURES_BLOCK = re.compile(r"^```[ \t]*(?:ya?ml[ \t]+)?figures[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def read_json_figure(path: Path, key: str, *, made_by: str, meaning: str, high: float) -> float:
    """The number under `key` of a JSON file the learner's own run wrote (e.g. capacity.json), in (0, high);
    fails naming the file, the key and how the file is made (`made_by`) when it is missing or not such a number."""
    import json

    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise LabCheckFailed(f"{path.name} is missing: {made_by}") from None
    except ValueError as exc:
        raise LabCheckFailed(f"{path.name} is not JSON: {exc}") from None
    value = data.get(key) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < high:
        raise LabCheckFailed(f"{path.name} must hold {key}, {meaning} > 0; got {value!r}")
    return float(value)


def read_figures(text: str, name: str) -> dict[str, float]:
    """The numbers of the report's figures block; fails, naming the fix, if it is missing or not numbers."""
    blocks = FIGURES_BLOCK.findall(text)
    if not blocks:
        raise LabCheckFailed(f"{name} has no figures block: put your figures in a fenced block that opens with "
                             "```yaml figures (one `name: number` per line, as the template shows)")
    if len(blocks) > 1:
        raise LabCheckFailed(f"{name} has {len(blocks)} figures blocks: keep one")
    try:
        data = yaml.safe_load(blocks[0]) or {}
    except yaml.YAMLError as exc:
        raise LabCheckFailed(f"{name}: the figures block is not YAML ({str(exc).splitlines()[0]}); write one "
                             "`name: number` per line") from None
    if not isinstance(data, dict):
        raise LabCheckFailed(f"{name}: the figures block must be `name: number` lines")
    figures = {}
    for key, value in data.items():
        if value is None:
            continue  # left empty: treated as not given
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LabCheckFailed(f"{name}: figure {key!r} is {value!r}; write a plain number (its unit is the one "
                                 "the template names, without the unit)")
        figures[str(key)] = float(value)
    return figures


def check_prose(found: dict[str, str], spec: Report, template: dict[str, str], name: str) -> None:
    """Every prose section present, filled, and not the template's own text."""
    missing = [s for s in SECTIONS if s not in found]
    if missing:
        raise LabCheckFailed(f"{name} lacks the section(s) {missing}: keep the template's '## ' headings")
    unfilled = [s for s in spec.prose
                if len(words(found[s])) < 3 or PLACEHOLDER.search(found[s])
                or (template.get(s) and words(found[s]) == words(template[s]))]
    if unfilled:
        raise LabCheckFailed(f"{name}: write {unfilled} in your own words (each still holds the template's text, "
                             "a TODO or nothing)")


def check_environment(found: dict[str, str], hardware: Hardware, name: str) -> None:
    env = found.get("Environment", "")
    for label, value in (("torch", hardware.torch), ("device", hardware.device_name)):
        if value and value not in env:
            raise LabCheckFailed(
                f"{name}: the Environment section does not state this machine's {label} ({value}); the figures "
                "must come from the machine you grade on. Run `infracourse report <week>` to stamp it, then "
                "re-measure if your figures came from elsewhere")


def compare_figures(reported: dict[str, float], spec: Report, measured: dict[str, dict], statuses: dict[str, str],
                    name: str) -> dict[str, dict]:
    """Compare each figure the lab asks for with the grader's own; returns what was compared (for `record`).

    `measured` maps a check id to the figures it recorded in this grade; `statuses` a check id to its status."""
    compared: dict[str, dict] = {}
    for figure in spec.figures:
        if figure.check is not None and statuses.get(figure.check) == "blocked":
            continue  # measured only on hardware this machine lacks: owed to a grade there
        if figure.name not in reported:
            raise LabCheckFailed(f"{name}: the figures block lacks {figure.name!r}: {figure.meaning}")
        ours = _grader_figure(figure, measured, statuses, name)
        mine = reported[figure.name]
        busy = _contention(figure, measured)
        if not _agree(mine, ours, figure, busy):
            raise LabCheckFailed(
                f"{name}: {figure.name} = {mine:.4g} in your figures block, but the grader "
                f"{'measured' if figure.check else 'computes, for this configuration,'} {ours:.4g} "
                f"({figure.meaning}; {_tolerance(figure, busy)}). Report the figure your own run printed for this "
                "configuration, on this machine, in the unit asked for"
                + ("; figures from another machine or an earlier version of your code differ: `infracourse measure` "
                   "writes this machine's into the block" if figure.check else ""))
        compared[figure.name] = {"value": mine, "target": ours, "unit": "",
                                 "target_is": "re-measured" if figure.check else "expected"}
    return compared


def _grader_figure(figure: ReportFigure, measured: dict[str, dict], statuses: dict[str, str], name: str) -> float:
    if figure.check is None:
        return float(figure.expected)
    status = statuses.get(figure.check, "not run")
    recorded = (measured.get(figure.check) or {}).get(figure.measured)
    if status != "passed":
        raise LabCheckFailed(f"{name}: {figure.name} cannot be checked: the check {figure.check!r}, which measures "
                             f"it, did not pass in this grade ({status}). Make it pass first")
    if recorded is None:  # a restarted judge has the earlier ones too (the runner's settled.json): a course bug
        raise RuntimeError(f"the grader has no {figure.measured!r} from check {figure.check!r} to compare "
                           f"{figure.name} with: a course bug, not a fault of your report; please report it")
    value = _field(recorded, figure.compare_with)
    if not isinstance(value, (int, float)):
        raise RuntimeError(f"the grader recorded no {figure.compare_with} for {figure.measured!r} (check "
                           f"{figure.check!r}): a course bug, not a fault of your report; please report it")
    return float(value)


def _field(recorded, name: str):
    """A field of a recorded figure, whether it came as a Figure or as its JSON object (a restarted judge's)."""
    return recorded.get(name) if isinstance(recorded, dict) else getattr(recorded, name, None)


BUSY_CAP = 3.0  # the most a busy grade widens a tolerance: learner code that loads the CPU on purpose gains no more


def _contention(figure: ReportFigure, measured: dict[str, dict]) -> float:
    """The CPU contention the figure's check recorded while it measured, at most BUSY_CAP (1: not asked for)."""
    if not figure.busy:
        return 1.0
    value = _field((measured.get(figure.check) or {}).get(figure.busy), "value")
    if not isinstance(value, (int, float)) or value < 1:
        raise RuntimeError(f"the grader recorded no CPU contention {figure.busy!r} (check {figure.check!r}) for "
                           f"{figure.name}: a course bug, not a fault of your report; please report it")
    return min(float(value), BUSY_CAP)


def _agree(mine: float, ours: float, figure: ReportFigure, busy: float = 1.0) -> bool:
    return figures_agree(mine, ours, factor=figure.factor, absolute=figure.absolute, busy=busy,
                         busy_moves=figure.busy_moves)


def figures_agree(mine: float, ours: float, *, factor: float = 1.0, absolute: float = 0.0, busy: float = 1.0,
                  busy_moves: str = "up") -> bool:
    """The learner's figure `mine` within `factor` (either side) or `absolute` of the grader's `ours`; where the
    grader's figure is off the way load moves it (larger for a time: busy_moves "up", smaller for a rate: "down"),
    the tolerance grows by `busy`, the contention its measurement ran under (hardware.cpu_contention), at most
    BUSY_CAP."""
    busy = min(max(busy, 1.0), BUSY_CAP)
    slower = busy if (ours > mine) == (busy_moves == "up") else 1.0
    if abs(mine - ours) <= absolute * slower:
        return True
    if mine == 0 or ours == 0 or (mine > 0) != (ours > 0):
        return False
    return max(mine / ours, ours / mine) <= factor * (slower if factor > 1 else 1.0)


def _tolerance(figure: ReportFigure, busy: float = 1.0) -> str:
    parts = [f"within {figure.factor:g}x either side"] if figure.factor > 1 else []
    if figure.absolute:
        parts.append(f"or {figure.absolute:g} apart")
    text = "accepted " + " ".join(parts) if parts else "must match"
    if figure.busy:
        way = "larger" if figure.busy_moves == "up" else "smaller"
        text += (f"; the grader's run shared the CPU {busy:.1f}x (load per core), so a grader's figure {way} than "
                 f"yours may be up to {busy:.1f}x further off")
    return text


def check_report(path: Path, spec: Report, hardware: Hardware, *, template: Path | None = None,
                 measured: dict[str, dict] | None = None, statuses: dict[str, str] | None = None) -> dict[str, dict]:
    """Fail (LabCheckFailed, naming the file and the fix) unless the report meets `spec`; returns the figures
    compared, each {value: the report's, target: the grader's}."""
    if not path.exists():
        raise LabCheckFailed(f"{path.name} is missing: copy the template back with `infracourse reset` and fill it")
    text = path.read_text(encoding="utf-8")
    template_sections = sections(template.read_text(encoding="utf-8")) if template and template.exists() else {}
    found = sections(text)
    check_prose(found, spec, template_sections, path.name)
    check_environment(found, hardware, path.name)
    if not spec.figures:
        return {}
    return compare_figures(read_figures(text, path.name), spec, measured or {}, statuses or {}, path.name)


@pytest.mark.check("report")
def test_report(learner, hardware, record, request):
    """The lab's report, as its lab.yaml `report:` section describes it."""
    session = request.config._infracourse
    spec = session.lab.report
    if spec is None:
        raise LabCheckFailed("lab.yaml has a report check but no `report:` section; this is a course bug")
    template = Path(request.config.getoption("--infracourse-lab")).parent / "starter" / spec.file
    compared = check_report(learner.path(spec.file), spec, hardware, template=template,
                            measured=session.figures, statuses=session.statuses)
    for figure_name, figure in compared.items():
        record(figure_name, figure["value"], target=figure["target"], target_is=figure["target_is"])
