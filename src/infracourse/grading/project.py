"""The checks every direction project (weeks 22-24, curriculum/tracks/) shares: the deliverables of 003 §3.

A project's report.md holds, besides its prose sections (PROJECT_SECTIONS) and its ```yaml figures block (compared
with the grade's measurements exactly as a weekly report's, grading.report_check), one ```yaml project block:

    ```yaml project
    run: python run.py --out raw          # the one command that reproduces the project's data; the grader runs it
    lock: requirements.lock               # pinned versions (name==version lines), a file of the project
    raw_data: [raw/baseline.json]         # what the run writes (.json, .jsonl, .csv), relative to where it runs
    evidence: [raw/trace.json]            # the bottleneck evidence the run writes: a Chrome trace or profile table
    failure_cases: [raw/failure.json]     # the run's record of a failure or regression case
    to_be_verified: [mlu-latency]         # the project's checks this machine could not run (blocked here)
    ```

Everything is checked as files and numbers, never as wording: the lock against the packages installed where the
grade runs, the command by running it (confined like the grading worker) from a clean copy, the data and
evidence by parsing what that run wrote, the to-be-verified list against the checks blocked in this grade (and
no figure may stand in for a blocked check: 003 forbids simulated results in place of missing hardware).

The five tests below are every project's (grading.shared): the grading plugin collects them for a track's project
as its lab.yaml asks, beside the track's own graders. The block and the lock file are read by grading.project_files.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from infracourse.grading.confined import ScriptRun, run_script
from infracourse.grading.project_files import Project, check_lock, read_project
from infracourse.grading.report import PLACEHOLDER, sections, words
from infracourse.grading.report_check import check_environment, compare_figures, read_figures
from infracourse.failures import LabCheckFailed
from infracourse.syllabus import load_lab

PROJECT_SECTIONS = (
    "Question and hypothesis", "Architecture", "Environment", "Run command", "Baseline", "Bottleneck evidence",
    "Optimisation comparison", "Failure cases", "To be verified", "Conclusion and limits",
)
PLAN_SECTIONS = ("Question and hypothesis", "Architecture", "Environment", "Run command", "Baseline", "To be verified")
DATA_SUFFIXES = (".json", ".jsonl", ".csv")


# ------------------------------------------------------------------ the run and its files
def parse_data(path: Path) -> int:
    """Records in a raw-data file (.json: items of its top list or keys of its object; .jsonl: lines; .csv: rows
    after the header); fails naming the file when it does not parse or holds nothing."""
    if not path.is_file():
        raise LabCheckFailed(f"{path.name} was not written")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix == ".json":
            data = json.loads(text)
            count = len(data) if isinstance(data, (list, dict)) else 0
        elif path.suffix == ".jsonl":
            count = len([json.loads(line) for line in text.splitlines() if line.strip()])
        elif path.suffix == ".csv":
            rows = list(csv.reader(io.StringIO(text)))
            count = max(0, len([r for r in rows if any(c.strip() for c in r)]) - 1)
        else:
            raise LabCheckFailed(f"{path.name}: raw data must be .json, .jsonl or .csv (files a reader can parse)")
    except (ValueError, csv.Error) as exc:
        raise LabCheckFailed(f"{path.name} does not parse as {path.suffix[1:]}: {exc}") from None
    if count == 0:
        raise LabCheckFailed(f"{path.name} parses but holds no records")
    return count


def parse_evidence(path: Path) -> tuple[str, int]:
    """('trace', complete events with a duration) for a Chrome trace, ('profile', rows) for a profile table."""
    if not path.is_file():
        raise LabCheckFailed(f"{path.name} (bottleneck evidence) was not written by your run command")
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError as exc:
        raise LabCheckFailed(f"{path.name} is not JSON ({exc}): export a Chrome trace (torch.profiler's "
                             "export_chrome_trace) or a profile table {{\"rows\": [...]}}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data if isinstance(data, list) else None
    if isinstance(events, list) and events:
        timed = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
                 and isinstance(e.get("dur"), (int, float)) and e.get("name")]
        if not timed:
            raise LabCheckFailed(f"{path.name}: a trace without one complete event with a duration shows no time")
        return "trace", len(timed)
    rows = data.get("rows") if isinstance(data, dict) else None
    if isinstance(rows, list):
        timed = [r for r in rows if isinstance(r, dict) and isinstance(r.get("name"), str)
                 and any(isinstance(r.get(k), (int, float)) for k in ("self_ms", "total_ms"))]
        if len(timed) < 2:
            raise LabCheckFailed(f"{path.name}: a profile table needs at least two rows with a name and self_ms or "
                                 "total_ms (where the time goes, compared)")
        return "profile", len(timed)
    raise LabCheckFailed(f"{path.name} is neither a Chrome trace ({{\"traceEvents\": [...]}}) nor a profile table "
                         "({\"rows\": [{\"name\": ..., \"self_ms\": ...}]})")


@dataclass
class ProjectRun:
    project: Project
    scratch: Path
    result: ScriptRun


_RUNS: dict[Path, ProjectRun] = {}  # one run of the command per judge process, shared by the checks that read it


def project_of(learner, spec) -> Project:
    return read_project(learner.path(spec.report.file).read_text(encoding="utf-8"), spec.report.file)


def project_run(learner, spec, hardware, scratch_root: Path, timeout_s: float) -> ProjectRun:
    """Run the project's command once, from a clean scratch folder, confined like the grading worker."""
    if learner.root in _RUNS:
        return _RUNS[learner.root]
    project = project_of(learner, spec)
    if project.script not in spec.files or not learner.path(project.script).is_file():
        raise LabCheckFailed(f"the run command's script {project.script!r} is not one of the project's files "
                             f"({', '.join(f for f in spec.files if f.endswith('.py'))})")
    scratch = scratch_root / "run"
    scratch.mkdir(parents=True, exist_ok=True)
    result = run_script(learner.root, project.script, project.run[2:], scratch=scratch,
                        gpu=hardware.gpu_count > 0, timeout_s=timeout_s)
    _RUNS[learner.root] = ProjectRun(project, scratch, result)
    return _RUNS[learner.root]


# ------------------------------------------------------------------ the five checks
def _session(request):
    return request.config._infracourse


def _template(request, spec) -> dict[str, str]:
    path = Path(request.config.getoption("--infracourse-lab")).parent / "starter" / spec.report.file
    return sections(path.read_text(encoding="utf-8")) if path.exists() else {}


def check_sections(found: dict[str, str], wanted: tuple[str, ...], template: dict[str, str], name: str) -> None:
    missing = [s for s in wanted if s not in found]
    if missing:
        raise LabCheckFailed(f"{name} lacks the section(s) {missing}: keep the template's '## ' headings")
    unfilled = [s for s in wanted if s != "Environment" and (len(words(found[s])) < 3 or PLACEHOLDER.search(found[s])
                or (template.get(s) and words(found[s]) == words(template[s])))]
    if unfilled:
        raise LabCheckFailed(f"{name}: write {unfilled} in your own words (each still holds the template's text, "
                             "a TODO or nothing)")


@pytest.mark.check("environment-pinned")
def test_environment_pinned(learner, request, record):
    """The lock file pins every package it names, and each pin is what is installed where the grade runs."""
    spec = _session(request).lab
    project = project_of(learner, spec)
    pins = check_lock(learner.path(project.lock))
    record("packages pinned", len(pins))


@pytest.mark.check("run-command")
def test_run_command(learner, request, hardware, lab_check, tmp_path_factory, record):
    """The report's one command runs from a clean copy and writes every raw-data and failure-case file it names."""
    spec = _session(request).lab
    run = project_run(learner, spec, hardware, tmp_path_factory.mktemp("project"), lab_check.timeout_s * 0.8)
    failure = run.result.failure(lab_check.timeout_s * 0.8)
    if failure:
        raise LabCheckFailed(f"the project's run command, from a clean copy of your files: {failure}")
    for rel in (*run.project.raw_data, *run.project.failure_cases):
        if Path(rel).suffix not in DATA_SUFFIXES:
            raise LabCheckFailed(f"{rel}: raw data must be .json, .jsonl or .csv (a reader can parse it)")
        try:
            records = parse_data(run.scratch / rel)
        except LabCheckFailed as exc:
            raise LabCheckFailed(f"`{' '.join(run.project.run)}` from a clean copy: {exc} (it must write each file "
                                 "the project block names under raw_data and failure_cases)") from None
        delivered = learner.path(rel)
        if not delivered.is_file():
            raise LabCheckFailed(f"{rel} is not among your delivered files: deliver the raw data your figures came "
                                 "from (your run command writes it)")
        parse_data(delivered)
        record(f"records in {rel}", records)
    record("run seconds", run.result.wall_s, unit="s")


@pytest.mark.check("project-plan")
def test_project_plan(learner, request, hardware, record):
    """Week 22's plan: question, architecture, environment, run command, baseline, and the to-be-verified list
    marked from the start: every check of the whole project (all three weeks) that this machine cannot run."""
    spec = _session(request).lab
    path = learner.path(spec.report.file)
    if not path.exists():
        raise LabCheckFailed(f"{path.name} is missing: `infracourse reset` brings the template back")
    text = path.read_text(encoding="utf-8")
    project = read_project(text, path.name)
    check_sections(sections(text), PLAN_SECTIONS, _template(request, spec), path.name)
    whole = load_lab(Path(request.config.getoption("--infracourse-lab")))  # every week's checks, with their needs
    cannot = {c.id: hardware.missing(c.needs) for c in whole.checks if not hardware.satisfies(c.needs)}
    missing = sorted(set(cannot) - set(project.to_be_verified))
    if missing:
        raise LabCheckFailed(f"{path.name}: this machine cannot run {missing} ({'; '.join(cannot[c] for c in missing)}), "
                             "but the project block's to_be_verified does not list them: mark every experiment that "
                             "lacks its hardware as to be verified from the start")
    unknown = sorted(set(project.to_be_verified) - {c.id for c in whole.checks})
    if unknown:
        raise LabCheckFailed(f"{path.name}: to_be_verified names {unknown}, which are not checks of this project")
    record("checks to be verified", len(cannot))


@pytest.mark.check("bottleneck-evidence")
def test_bottleneck_evidence(learner, request, hardware, tmp_path_factory, record):
    """The traces or profiles the run command wrote parse and show where time goes."""
    spec = _session(request).lab
    limit_s = spec.check("run-command").timeout_s * 0.8
    run = project_run(learner, spec, hardware, tmp_path_factory.mktemp("project"), limit_s)
    failure = run.result.failure(limit_s)
    if failure:
        raise LabCheckFailed(f"no evidence without a run: {failure}")
    for rel in run.project.evidence:
        kind, count = parse_evidence(run.scratch / rel)
        record(f"{kind} entries in {rel}", count)


@pytest.mark.check("report")
def test_project_report(learner, hardware, request, record):
    """The final report: every section in the learner's words, this machine stamped, the figures as measured, and
    the to-be-verified list exactly the checks blocked here, with no figure standing in for one of them."""
    session = _session(request)
    spec = session.lab
    path = learner.path(spec.report.file)
    if not path.exists():
        raise LabCheckFailed(f"{path.name} is missing: `infracourse reset` brings the template back")
    text = path.read_text(encoding="utf-8")
    project = read_project(text, path.name)
    found = sections(text)
    check_sections(found, PROJECT_SECTIONS, _template(request, spec), path.name)
    check_environment(found, hardware, path.name)
    check_to_be_verified(project, spec, session.statuses, path.name)
    reported = read_figures(text, path.name)
    blocked = {c.id for c in spec.checks if session.statuses.get(c.id) == "blocked"}
    simulated = [f.name for f in spec.report.figures if f.check in blocked and f.name in reported]
    if simulated:
        raise LabCheckFailed(f"{path.name} gives {simulated}, measured by checks this machine could not run "
                             f"({sorted(blocked)}): leave them out and list those checks under to_be_verified. A "
                             "figure from another machine or a simulation may not stand in for a measurement here")
    compared = compare_figures(reported, spec.report, session.figures, session.statuses, path.name)
    for name, figure in compared.items():
        record(name, figure["value"], target=figure["target"])


def check_to_be_verified(project: Project, spec, statuses: dict[str, str], name: str) -> None:
    known = {c.id for c in spec.checks} | set(spec.later)
    unknown = [c for c in project.to_be_verified if c not in known]
    if unknown:
        raise LabCheckFailed(f"{name}: to_be_verified names {unknown}, which are not checks of this project "
                             f"(its checks: {', '.join(sorted(known))})")
    blocked = sorted(c.id for c in spec.checks if statuses.get(c.id) == "blocked")
    missing = [c for c in blocked if c not in project.to_be_verified]
    if missing:
        raise LabCheckFailed(f"{name}: {missing} could not run on this machine (blocked: "
                             f"{'; '.join(spec.check(c).needs for c in missing)}) but to_be_verified does not list "
                             "them: every experiment that lacked its hardware is marked to be verified")
    ran = [c for c in project.to_be_verified if statuses.get(c) not in (None, "blocked")]
    if ran:
        raise LabCheckFailed(f"{name}: to_be_verified lists {ran}, which ran on this machine in this grade: they are "
                             "verified (or failed) here; list only what this machine could not run")
