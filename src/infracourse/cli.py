"""The `infracourse` command: each command parses, calls one function, and prints."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from infracourse import views
from infracourse.cohort.cli import cohort_app, release_command, submit_command
from infracourse.course import Course
from infracourse.grading.results import GradeResult
from infracourse.progress import ProgressError
from infracourse.syllabus import CourseFileError, json_schema
from infracourse.workspace import Workspace, WorkspaceError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="A self-paced AI-infrastructure course graded on your own hardware.")
dev_app = typer.Typer(help="Tools for course authors.", no_args_is_help=True)
app.add_typer(dev_app, name="dev")
console = Console()
err = Console(stderr=True)

WorkspaceOpt = typer.Option(None, "--workspace", "-w", help="Workspace folder (default: found from the current one).")


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def _context(workspace: Optional[Path]) -> tuple[Workspace, Course]:
    try:
        return Workspace.find(workspace), Course()
    except (WorkspaceError, ProgressError, CourseFileError) as exc:
        _fail(str(exc))


def _week(course: Course, ref: str):
    try:
        return course.week(ref)
    except (KeyError, CourseFileError) as exc:
        _fail(str(exc).strip("'\""))


@app.command()
def init(folder: Path = typer.Argument(..., help="Folder for the workspace (created if missing).")):
    """Create a workspace: a config and a progress database under FOLDER/.infracourse/."""
    try:
        ws = Workspace.init(folder)
    except (WorkspaceError, ProgressError) as exc:
        _fail(str(exc))
    console.print(f"Workspace ready at [bold]{ws.root}[/bold]. Next: cd {ws.root} && infracourse next")


@app.command("next")
def next_(workspace: Optional[Path] = WorkspaceOpt):
    """Unlock the next week in syllabus order."""
    ws, course = _context(workspace)
    week = ws.next_week(course)
    if week is None:
        console.print("Every week is unlocked. `infracourse status` shows where you stand.")
        return
    if week.planned:
        console.print(f"[yellow]{week.id} — {week.title}[/yellow] is [bold]planned[/bold]: its lab is not built yet.\n"
                      f"Read its objectives with `infracourse syllabus {week.id}`; move past it with "
                      f"`infracourse unlock {week.id}` (or unlock any later week directly).")
        raise typer.Exit(1)
    _unlock(ws, course, week)


@app.command()
def unlock(week: str = typer.Argument(..., help="week07, 7 or w7"), workspace: Optional[Path] = WorkspaceOpt):
    """Open any week directly (planned weeks are recorded as skipped past)."""
    ws, course = _context(workspace)
    _unlock(ws, course, _week(course, week))


def _unlock(ws: Workspace, course: Course, week) -> None:
    try:
        report = ws.unlock(course, week)
    except CourseFileError as exc:
        _fail(str(exc))
    views.print_unlock(console, course, report)


@app.command()
def status(workspace: Optional[Path] = WorkspaceOpt, as_json: bool = typer.Option(False, "--json")):
    """All 24 weeks: locked / unlocked / passed / verified on GPU, last grade, blocked checks."""
    ws, course = _context(workspace)
    from infracourse.hardware import detect

    rows = views.status_rows(ws, course)
    hw = detect()
    if as_json:
        print(json.dumps({"tier": hw.tier, "device": hw.device_name, "weeks": rows}, indent=1))
        return
    views.print_status(console, rows, hw)


@app.command()
def grade(week: str = typer.Argument(..., help="week07, 7 or w7"), workspace: Optional[Path] = WorkspaceOpt,
          as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
          no_record: bool = typer.Option(False, "--no-record", help="Do not store this grade.")):
    """Grade a week's lab on this machine. Exit code 0 exactly when the week is complete."""
    ws, course = _context(workspace)
    w = _week(course, week)
    result = _grade(ws, course, w, quiet=as_json)
    if not no_record:
        ws.progress.record(result)
    plots = views.write_plots(ws.week_dir(w), result)
    if as_json:
        print(json.dumps(result.as_dict(), indent=1))
    else:
        views.print_grade(console, result, plots)
    raise typer.Exit(0 if result.complete else 1)


def _grade(ws: Workspace, course: Course, week, quiet: bool = False) -> GradeResult:
    from infracourse.grading.runner import grade as run_grade

    if week.planned:
        _fail(f"{week.id} ({week.title}) is planned: there is no lab to grade yet")
    folder = ws.week_dir(week)
    if not folder.is_dir():
        _fail(f"{folder} does not exist: unlock the week first with `infracourse unlock {week.id}`")
    try:
        lab = course.lab(week)
    except CourseFileError as exc:
        _fail(str(exc))
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=quiet) as bar:
        task = bar.add_task(f"grading {week.id}", total=len(lab.spec.checks))

        def on_event(event: dict) -> None:
            if event["event"] == "start":
                bar.update(task, description=f"{week.id}: {event['check']}")
            else:
                bar.advance(task)

        return run_grade(course, week.id, folder, on_event=on_event)


@app.command()
def hint(week: str = typer.Argument(...), workspace: Optional[Path] = WorkspaceOpt):
    """Reveal one more hint for a week (they build on each other)."""
    ws, course = _context(workspace)
    w = _week(course, week)
    try:
        hints = course.lab(w).spec.hints
    except CourseFileError as exc:
        _fail(str(exc))
    shown = ws.progress.next_hint_index(w.id, len(hints))
    for i, text in enumerate(hints[:shown], 1):
        console.print(f"[bold]Hint {i}/{len(hints)}:[/bold] {text}")
    if shown == len(hints):
        console.print("[dim]That was the last hint.[/dim]")


@app.command()
def reset(week: str = typer.Argument(...), workspace: Optional[Path] = WorkspaceOpt):
    """Restore a week's starter files, keeping a timestamped backup of yours."""
    ws, course = _context(workspace)
    w = _week(course, week)
    try:
        backup = ws.reset(course, w)
    except CourseFileError as exc:
        _fail(str(exc))
    console.print(f"{w.id} restored to its starter files." +
                  (f" Your versions are in {backup}." if backup else " (Nothing of yours differed.)"))


@app.command()
def watch(week: str = typer.Argument(...), workspace: Optional[Path] = WorkspaceOpt,
          interval: float = typer.Option(1.0, help="Seconds between looks at the files.")):
    """Regrade whenever a file in the week's folder is saved (Ctrl-C to stop)."""
    ws, course = _context(workspace)
    w = _week(course, week)
    folder = ws.week_dir(w)
    seen = None
    try:
        while True:
            stamp = views.folder_stamp(folder)
            if stamp != seen:
                seen = stamp
                result = _grade(ws, course, w)
                ws.progress.record(result)
                views.print_grade(console, result, views.write_plots(folder, result))
                console.print(f"[dim]watching {folder} — save a file to regrade, Ctrl-C to stop[/dim]")
                seen = views.folder_stamp(folder)
            time.sleep(interval)
    except KeyboardInterrupt:
        console.print("stopped watching")


@app.command()
def report(week: str = typer.Argument(...), workspace: Optional[Path] = WorkspaceOpt):
    """Write this machine's environment into the week's report.md."""
    from infracourse.grading.report import stamp_environment
    from infracourse.guard import LabCheckFailed
    from infracourse.hardware import detect

    ws, course = _context(workspace)
    w = _week(course, week)
    spec = course.lab(w).spec
    if not spec.report:
        _fail(f"{w.id} asks for no report")
    path = ws.week_dir(w) / spec.report
    if not path.exists():
        _fail(f"{path} is missing: `infracourse reset {w.id}` restores the template (backing up your files)")
    try:
        stamp_environment(path, detect())
    except LabCheckFailed as exc:
        _fail(str(exc))
    console.print(f"Environment written into {path}")


@app.command()
def doctor(calibrate: bool = typer.Option(False, "--calibrate", help="Measure this GPU's ceilings (cached)."),
           as_json: bool = typer.Option(False, "--json")):
    """Versions, GPU, tier, what will be blocked here; --calibrate measures this GPU's ceilings."""
    from infracourse.hardware import calibrate as run_calibration
    from infracourse.hardware import cached_ceilings, detect

    hw = detect()
    ceilings = None
    if calibrate:
        if not hw.gpu_count:
            _fail("calibration needs a CUDA GPU: this machine has none, so GPU checks are blocked here")
        ceilings = run_calibration(hw, force=True)
    else:
        ceilings = cached_ceilings(hw) if hw.gpu_count else None
    blocked = views.blocked_checks(Course(), hw)
    if as_json:
        print(json.dumps({"hardware": hw.as_dict(), "ceilings": ceilings and ceilings.__dict__,
                          "blocked": blocked}, indent=1))
        return
    views.print_doctor(console, hw, ceilings, blocked)


@app.command()
def syllabus(week: Optional[str] = typer.Argument(None), schema: bool = typer.Option(False, "--schema")):
    """The course's weeks (or one week in full); --schema prints the JSON Schema of the course files."""
    if schema:
        print(json.dumps(json_schema(), indent=1))
        return
    try:
        course = Course()
        weeks = [course.week(week)] if week else course.syllabus.weeks
    except (KeyError, CourseFileError) as exc:
        _fail(str(exc).strip("'\""))
    views.print_syllabus(console, weeks, detail=week is not None)


@dev_app.command("check")
def dev_check(week: Optional[str] = typer.Argument(None, help="One week (default: every built lab).")):
    """For course authors: hints exist, no stray files, starter fails, solution passes."""
    from infracourse.dev import check_course

    problems = check_course(Course(), week, log=lambda m: err.print(f"[dim]{m}[/dim]"))
    for problem in problems:
        console.print(f"[red]✗[/red] {problem}")
    if problems:
        raise typer.Exit(1)
    console.print("[green]course OK[/green]")


app.command("submit")(submit_command)
app.command("release")(release_command)
app.add_typer(cohort_app, name="cohort")


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
