"""The `infracourse` command: each command parses, calls one function, and prints.

Start-up is kept light (`status`, `hint`, `next`, `--help` answer in well under a second): torch, pydantic
and the instructor's cohort tools are imported inside the commands that need them, never at import time.
Every command runs under `_guarded`: a problem the learner can fix ends in one line on stderr and a non-zero
exit, Ctrl-C in "interrupted" (exit 130), never in a traceback (INFRACOURSE_DEBUG=1 shows it).
"""
from __future__ import annotations

import errno
import functools
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from infracourse import __version__, views
from infracourse.safe_text import escape


def Course(*args, **kwargs):  # noqa: N802 - the course (and pydantic with it) is loaded on first use only
    from infracourse.course import Course as _Course  # why: start-up: loaded on use, not when the CLI starts

    return _Course(*args, **kwargs)


class _Group(TyperGroup):
    """The top-level group: the instructor's commands (submit, release, cohort) are imported when run, and
    only listed (name and one line of help) otherwise: they pull in jinja2, zip and gradebook code."""

    LAZY = {"submit": "Bundle a week's files with your last grade and this machine's facts, for your instructor.",
            "release": "Write a learner copy of the course with no reference solution in it.",
            "feedback": "Your instructor's rubric scores and comments on a week, once they publish them.",
            "cohort": "For instructors: a gradebook of a cohort's submissions, regraded, exported, published."}
    _listing = False

    def list_commands(self, ctx):
        return [*super().list_commands(ctx), *(n for n in self.LAZY if n not in self.commands)]

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            if self._listing:
                return TyperCommand(name=name, help=self.LAZY[name], callback=None)
            self.commands.update(_instructor_commands())
        return super().get_command(ctx, name)

    def format_help(self, ctx, formatter):
        self._listing = True
        try:
            return super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(cls=_Group, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]},
                  help="A self-paced AI-infrastructure course graded on your own hardware.")
dev_app = typer.Typer(help="Tools for course authors.", no_args_is_help=True)
app.add_typer(dev_app, name="dev")
track_app = typer.Typer(help="Weeks 22-24: list the direction tracks and choose yours.", no_args_is_help=True)
app.add_typer(track_app, name="track")
model_app = typer.Typer(help="Weeks 15-18: checkpoints in the Hugging Face layout the serving weeks load.",
                        no_args_is_help=True)
app.add_typer(model_app, name="model")
console = Console()
err = Console(stderr=True, soft_wrap=True)  # an error stays one line, whole paths included

WorkspaceOpt = typer.Option(None, "--workspace", "-w", help="Workspace folder (default: found from the current one).")
WeekArg = typer.Argument(None, help="week07, 7 or w7 (default: the week folder you are in)", show_default=False)
CheckOpt = typer.Option(None, "--check", "-c", show_default=False, help="Grade only this check (repeatable) and "
                        "the checks it requires: a partial grade, in seconds, that never completes the week.")
PatternOpt = typer.Option(None, "-k", show_default=False, help="Grade only the checks whose id matches, as pytest "
                          "-k does (-k add, -k \"reduce and not bandwidth\"), and the checks they require.")
_global = {"workspace": None}  # `infracourse --workspace DIR <command>`: set by the callback on every run
_PASS_THROUGH = (typer.Exit, typer.Abort, typer.TyperException,
                 *(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"))


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


def _os_problem(exc: OSError) -> str:
    where = exc.filename or ""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "work in a copy on a writable disk" if exc.errno == errno.EROFS else f"fix with `chmod u+w {where}`"
        return f"permission problem: {where}: {exc.strerror} ({fix})"
    if exc.errno == errno.ENOSPC:
        return f"the disk is full writing {where}: free some space and run the command again"
    return f"{where}: {exc.strerror or exc}" if where else str(exc)


def _terminated(signum, frame):
    raise KeyboardInterrupt  # `kill` stops a command as Ctrl-C does: its graders and scratch go with it


def _guarded(command):
    """One clear line and a non-zero exit for every failure; 'interrupted' (130) on Ctrl-C."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        on_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _terminated) if on_main else None
        try:
            return command(*args, **kwargs)
        except _PASS_THROUGH:
            raise
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:
            from infracourse.progress import ProgressError
            from infracourse.syllabus import CourseFileError
            from infracourse.workspace import WorkspaceError  # why: start-up: loaded on use, not when the CLI starts

            if isinstance(exc, (WorkspaceError, ProgressError, CourseFileError)):
                _fail(str(exc))
            if isinstance(exc, KeyError):
                _fail(str(exc.args[0] if exc.args else exc))
            if isinstance(exc, OSError):
                _fail(_os_problem(exc))
            if type(exc).__name__ == "ValidationError" and hasattr(exc, "errors"):  # pydantic: a bad value given
                _fail("invalid " + "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'} {e.get('input')!r}: "
                                             f"{e['msg']}" for e in exc.errors()))
            if os.environ.get("INFRACOURSE_DEBUG"):
                raise
            _fail(f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())} (a bug in infracourse: please "
                  "report it with the output of INFRACOURSE_DEBUG=1 and the same command)", code=3)
        finally:
            if previous is not None:  # a caller's own handler (a test runner's) is its again
                signal.signal(signal.SIGTERM, previous)
    return run


def _command(*args, **kwargs):
    """`@app.command(...)`, guarded."""
    return lambda fn: app.command(*args, **kwargs)(_guarded(fn))


def _instructor_commands() -> dict:
    # why: start-up: loaded on use, not when the CLI starts
    from infracourse.cohort.cli import cohort_app, feedback_command, release_command, submit_command

    holder = typer.Typer()
    holder.command("submit")(_guarded(submit_command))
    holder.command("release")(_guarded(release_command))
    holder.command("feedback")(_guarded(feedback_command))
    holder.add_typer(cohort_app, name="cohort")
    return typer.main.get_group(holder).commands


def _version(show: bool) -> None:
    if show:
        print(f"infracourse {__version__}")
        raise typer.Exit()


@app.callback()
def _options(workspace: Optional[Path] = WorkspaceOpt,
             version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")):
    """A self-paced AI-infrastructure course graded on your own hardware."""
    _global["workspace"] = workspace


def _context(workspace: Optional[Path]):
    from infracourse.workspace import Workspace  # why: start-up: loaded on use, not when the CLI starts

    ws = Workspace.find(workspace or _global["workspace"])
    if ws.progress.notice:
        err.print(f"[yellow]note:[/yellow] {escape(ws.progress.notice)}")
    return ws, Course(track=ws.track)


def _week(course, ref: Optional[str], ws=None):
    if ref is None:
        ref = ws.week_here() if ws is not None else None
        if ref is None:
            _fail("which week? name it (e.g. `week07` or `7`), or run the command inside a week's folder")
    try:
        return course.week(ref)
    except KeyError as exc:
        _fail(str(exc.args[0]) if exc.args else str(exc))  # str(KeyError) quotes it: strip() ate the week's quote


@_command()
def init(folder: Path = typer.Argument(..., help="Folder for the workspace (created if missing).")):
    """Create a workspace: a config and a progress database under FOLDER/.infracourse/."""
    from infracourse.workspace import Workspace  # why: start-up: loaded on use, not when the CLI starts

    ws = Workspace.init(folder)
    console.print(f"Workspace ready at [bold]{escape(str(ws.root))}[/bold]. "
                  f"Next: cd {escape(str(ws.root))} && infracourse next", soft_wrap=True)


@_command("next")
def next_(workspace: Optional[Path] = WorkspaceOpt):
    """Unlock the next week in syllabus order."""
    ws, course = _context(workspace)
    week = ws.next_week(course)
    if week is None:
        console.print("Every week is unlocked. `infracourse status` shows where you stand.")
        return
    if week.planned:
        console.print(f"[yellow]{escape(week.id)} — {escape(week.title)}[/yellow] is [bold]planned[/bold]: its lab "
                      f"is not built yet.\nRead its objectives with `infracourse syllabus {week.id}`; move past it "
                      f"with `infracourse unlock {week.id}` (or unlock any later week directly).")
        raise typer.Exit(1)
    views.print_unlock(console, course, ws.unlock(course, week))


@_command()
def unlock(week: str = typer.Argument(..., help="week07, 7 or w7"), workspace: Optional[Path] = WorkspaceOpt):
    """Open any week directly (planned weeks are recorded as skipped past)."""
    ws, course = _context(workspace)
    views.print_unlock(console, course, ws.unlock(course, _week(course, week)))


@track_app.command("list")
@_guarded
def track_list(workspace: Optional[Path] = WorkspaceOpt):
    """The tracks of weeks 22-24: what each project is, and which one you chose."""
    from infracourse.workspace import Workspace, WorkspaceError  # why: start-up: loaded on use, not when the CLI starts

    try:
        chosen = Workspace.find(workspace or _global["workspace"]).track
    except WorkspaceError:
        chosen = None  # listing needs no workspace
    views.print_tracks(console, Course(), chosen)


@track_app.command("choose")
@_guarded
def track_choose(name: str = typer.Argument(..., help="A track id from `infracourse track list`."),
                 workspace: Optional[Path] = WorkspaceOpt):
    """Choose your track: weeks 22-24 then unlock its project (in project/)."""
    ws, course = _context(workspace)
    moved = ws.choose_track(course, name)
    track = course.track(name)
    console.print(f"Track [bold]{escape(track.title)}[/bold] chosen." +
                  (escape(f" Your earlier project was moved to {moved}.") if moved else "") +
                  escape(" Next: `infracourse unlock week22` (or `infracourse next` when you get there)."))


@model_app.command("make")
@_guarded
def model_make(out: Path = typer.Option(..., "--out", help="Folder to write (created; must hold no checkpoint)."),
               layers: Optional[int] = typer.Option(None, help="Decoder layers (default 4)."),
               hidden: Optional[int] = typer.Option(None, help="hidden_size (default 512)."),
               heads: Optional[int] = typer.Option(None, help="Query heads (default 8)."),
               kv_heads: Optional[int] = typer.Option(None, help="num_key_value_heads: 1 .. heads, dividing heads "
                                                      "(default 2)."),
               vocab: Optional[int] = typer.Option(None, help="vocab_size (default 1024)."),
               intermediate: Optional[int] = typer.Option(None, help="SwiGLU width (default 8/3 hidden, to 64)."),
               max_positions: Optional[int] = typer.Option(None, help="max_position_embeddings (default 2048)."),
               tie: bool = typer.Option(False, "--tie", help="Tie lm_head to the embeddings (no lm_head.weight)."),
               dtype: str = typer.Option("fp32", help="fp32, bf16 or fp16: the dtype the weights are stored in."),
               seed: int = typer.Option(0, help="Same seed, same bytes."),
               shard_mb: Optional[float] = typer.Option(None, help="Split into shards of about this many MiB, "
                                                        "with model.safetensors.index.json.")):
    """Write a random-weight Llama-style checkpoint (config.json + *.safetensors), as a real model on disk is."""
    from infracourse.kit.hf_checkpoint import CheckpointError, make_and_describe  # why: start-up: loads torch

    given = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "vocab": vocab,
             "intermediate": intermediate, "max_positions": max_positions}
    try:
        summary = make_and_describe(out, {k: v for k, v in given.items() if v is not None}, tie=tie,
                                    dtype=dtype, seed=seed, shard_mb=shard_mb)
    except CheckpointError as exc:
        _fail(str(exc))
    console.print(escape(summary), soft_wrap=True)


@_command()
def status(workspace: Optional[Path] = WorkspaceOpt, as_json: bool = typer.Option(False, "--json"),
           completion: bool = typer.Option(False, "--completion", help="The course's six completion criteria "
                                            "and the checks behind each, from your last grades."),
           certificate: Optional[Path] = typer.Option(None, "--certificate", help="With --completion: write the "
                                                      "certificate as FOLDER/completion.json and completion.html.")):
    """Every week: locked / unlocked / passed / verified on GPU, last grade; overall progress and what next."""
    ws, course = _context(workspace)
    if completion or certificate:
        _completion(ws, course, as_json, certificate)
        return
    rows = views.status_rows(ws, course)
    if as_json:
        from infracourse.hardware import detect  # scripts get this machine's tier; the table does not need it

        hw = detect()
        print(json.dumps({"tier": hw.tier, "device": hw.device_name, "weeks": rows,
                          "next": views.next_step(ws, course), **_drill_status(ws)}, indent=1))
        return
    views.print_status(console, rows, views.next_step(ws, course))
    for line in _drill_status(ws)["lines"]:
        console.print(escape(line), soft_wrap=True)


def _drill_status(ws) -> dict:
    """The start self-test's suggestion and the drills' record (infracourse.drills), for `status`."""
    # why: start-up: loaded on use, not when the CLI starts
    from infracourse.drills.selftest import summary_line
    from infracourse.drills.session import by_topic, history_line

    selftest, history = ws.progress.last_selftest(), ws.progress.drill_history()
    return {"selftest": selftest, "drills_by_topic": by_topic(history),
            "lines": [summary_line(selftest), history_line(history)]}


def _completion(ws, course, as_json: bool, out: Optional[Path]) -> None:
    import yaml

    from infracourse import completion as done  # why: start-up: loaded on use, not when the CLI starts

    results = {w.id: r for w in course.syllabus.weeks if (r := ws.progress.last_grade(w.id)) is not None}
    config = yaml.safe_load((ws.meta / "config.yaml").read_text()) or {}
    cert = done.certificate(course, results, learner=config.get("learner"), track=ws.track)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "completion.json").write_text(json.dumps(cert, indent=1))
        (out / "completion.html").write_text(done.certificate_page(cert))
    if as_json:
        print(json.dumps(cert, indent=1))
    else:
        views.print_completion(console, cert)
        if out:
            console.print(escape(f"wrote {out / 'completion.json'} and {out / 'completion.html'}"), soft_wrap=True)


@_command()
def grade(week: Optional[str] = WeekArg, workspace: Optional[Path] = WorkspaceOpt,
          as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
          no_record: bool = typer.Option(False, "--no-record", help="Do not store this grade."),
          check: Optional[list[str]] = CheckOpt, pattern: Optional[str] = PatternOpt):
    """Grade a week's lab on this machine. Exit code 0 exactly when the week is complete (with --check or -k:
    when every check graded passed)."""
    ws, course = _context(workspace)
    w = _week(course, week, ws)
    result = _grade(ws, course, w, quiet=as_json, checks=check, pattern=pattern)
    if not no_record:
        _record(ws, result)
    plots = views.write_plots(ws.week_dir(w), result)
    if as_json:
        print(json.dumps(result.as_dict(), indent=1))
    else:
        views.print_grade(console, result, plots)
    raise typer.Exit(0 if (result.all_passed if result.partial else result.complete) else 1)


def _record(ws, result) -> None:
    ws.progress.record(result)
    ws.save_result(result)


def _week_folder(ws, week) -> Path:
    folder = ws.week_dir(week)
    if not folder.is_dir():
        _fail(f"{folder} does not exist: unlock the week first with `infracourse unlock {week.id}`")
    return folder


def _grade(ws, course, week, quiet: bool = False, checks: Optional[list[str]] = None, pattern: Optional[str] = None):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # why: start-up: loaded on use, not when the CLI starts
    from infracourse.grading.runner import grade as run_grade
    from infracourse.grading.selection import SelectionError, named_checks, with_prerequisites
    from infracourse.hardware import detect

    if week.planned:
        _fail(f"{week.id} ({week.title}) is planned: there is no lab to grade yet")
    folder = _week_folder(ws, week)
    lab = course.lab(week)
    try:
        named = named_checks(lab.spec, checks or (), pattern)
    except SelectionError as exc:
        _fail(str(exc))
    hardware = detect()
    total = len(lab.spec.checks) if named is None else \
        len(with_prerequisites(lab.spec, named, blocked=lambda c: hardware.missing(c.needs)))
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=quiet) as bar:
        task = bar.add_task(f"grading {week.id}", total=total)

        def on_event(event: dict) -> None:
            if event["event"] == "start":
                bar.update(task, description=escape(f"{week.id}: {event['check']}"))
            elif event["event"] == "calling":  # where a slow check spends its time: which call, on what
                bar.update(task, description=escape(f"{week.id}: {event['check']}: {event['target']}"
                                                     f"({event.get('inputs', '')})"))
            else:
                bar.advance(task)

        return run_grade(course, lab, folder, hardware=hardware, on_event=on_event,
                         compile_cache=ws.compile_cache(week), checks=named)


@_command()
def hint(week: Optional[str] = WeekArg, workspace: Optional[Path] = WorkspaceOpt):
    """Reveal one more hint for a week (they build on each other)."""
    ws, course = _context(workspace)
    w = _week(course, week, ws)
    hints = course.lab(w).spec.hints
    if not hints:
        _fail(f"{w.id} has no hints")
    shown = ws.progress.next_hint_index(w.id, len(hints))
    views.print_hints(console, hints[:shown], len(hints))


@_command()
def reset(week: Optional[str] = WeekArg, workspace: Optional[Path] = WorkspaceOpt):
    """Restore a week's starter files, keeping a timestamped backup of yours."""
    ws, course = _context(workspace)
    w = _week(course, week, ws)
    backup = ws.reset(course, w)
    console.print(escape(f"{w.id} restored to its starter files." +
                         (f" Your versions are in {backup}." if backup else " (Nothing of yours differed.)")),
                  soft_wrap=True)  # the terminal wraps it: the path stays one piece to copy


@_command()
def watch(week: Optional[str] = WeekArg, workspace: Optional[Path] = WorkspaceOpt,
          interval: float = typer.Option(0.5, help="Seconds between looks at the files."),
          check: Optional[list[str]] = CheckOpt, pattern: Optional[str] = PatternOpt):
    """Regrade whenever a file in the week's folder is saved (Ctrl-C to stop); --check / -k as for grade."""
    from infracourse.watch import watch_loop  # why: start-up: loaded on use, not when the CLI starts

    ws, course = _context(workspace)
    w = _week(course, week, ws)
    folder = _week_folder(ws, w)

    def grade_once():
        result = _grade(ws, course, w, checks=check, pattern=pattern)
        _record(ws, result)
        return result

    def show(result) -> None:
        console.clear()
        views.print_watch(console, result, views.next_step(ws, course) if result.complete else None)
        console.print(f"[dim]watching {escape(str(folder))} — save a file to regrade, Ctrl-C to stop[/dim]",
                      soft_wrap=True)

    from infracourse.grading import judges  # why: start-up: only watch keeps a warm judge interpreter

    judges.keep_warm()  # every save regrades: each judge forks from one interpreter that imported torch once
    try:
        watch_loop(folder, grade_once, show, interval=interval)
    except KeyboardInterrupt:
        console.print("stopped watching")


@_command()
def run(week: Optional[str] = WeekArg,
        command: Optional[list[str]] = typer.Argument(None, show_default=False, help="After --: your command, "
                                                      "e.g. -- python bench.py --n 1000 (default: python)"),
        workspace: Optional[Path] = WorkspaceOpt):
    """Run your command on the week's files as a grade runs your code: TRITON_INTERPRET=1 without a GPU, the
    grader's environment and sandbox. Nothing is graded; the exit code is your command's."""
    from infracourse.grading.tryout import run_like_a_grade
    from infracourse.hardware import detect  # why: start-up: loaded on use, not when the CLI starts

    ws, course = _context(workspace)
    command = list(command or [])
    try:
        w = _week(course, week, ws) if week is None else course.week(week)
    except KeyError:  # not a week: the command's first word (`infracourse run -- python bench.py` in a week folder)
        command, w = [week, *command], _week(course, None, ws)
    raise typer.Exit(run_like_a_grade(course.lab(w), _week_folder(ws, w), command, detect()))


@_command()
def measure(week: Optional[str] = WeekArg, workspace: Optional[Path] = WorkspaceOpt):
    """Measure the figures your report states as the grader does, on this machine and your code, and write them
    into report.md's figures block (the diff is shown). The grade it takes is not recorded."""
    from infracourse.grading.measure import diff, measure_report, measuring_checks
    from infracourse.failures import LabCheckFailed  # why: start-up: loaded on use, not when the CLI starts

    ws, course = _context(workspace)
    w = _week(course, week, ws)
    spec = course.lab(w).spec
    checks = measuring_checks(spec)
    if not checks:
        _fail(f"{w.id}'s report states no figure that a check measures: there is nothing to measure")
    path = _week_folder(ws, w) / spec.report.file
    if not path.exists():
        _fail(f"{path} is missing: `infracourse reset {w.id}` restores the template (backing up your files)")
    try:
        old, new, measured = measure_report(spec, path, lambda ids: _grade(ws, course, w, checks=ids))
    except LabCheckFailed as exc:
        _fail(str(exc))
    console.print(escape(diff(old, new, path.name)) or escape(f"{path.name}: its figures already are this machine's"),
                  soft_wrap=True)
    for name, why in measured.left.items():
        console.print(f"[yellow]{escape(name)}: left as it was, not measured here[/yellow] ({escape(why[:300])})")


@_command()
def report(week: Optional[str] = WeekArg, workspace: Optional[Path] = WorkspaceOpt):
    """Write this machine's environment into the week's report.md."""
    from infracourse.grading.report import stamp_environment
    from infracourse.failures import LabCheckFailed
    from infracourse.hardware import detect  # why: start-up: loaded on use, not when the CLI starts

    ws, course = _context(workspace)
    w = _week(course, week, ws)
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
    console.print(escape(f"Environment written into {path}"), soft_wrap=True)


@_command()
def doctor(calibrate: bool = typer.Option(False, "--calibrate", help="Measure this GPU's ceilings (cached)."),
           as_json: bool = typer.Option(False, "--json"),
           plan: bool = typer.Option(False, "--plan", help="For each week ahead: what runs here, what is blocked, "
                                     "and the GPUs, minutes and memory to rent for it."),
           workspace: Optional[Path] = WorkspaceOpt):
    """Versions, GPU, tier, what will be blocked here; --calibrate measures this GPU's ceilings."""
    # why: start-up: loaded on use, not when the CLI starts
    from infracourse.hardware import calibrate as run_calibration
    from infracourse.hardware import cached_ceilings, detect, toolchain_warnings

    hw = detect()
    if plan:
        _plan(hw, workspace, as_json)
        return
    ceilings = None
    if calibrate:
        if not hw.gpu_count:
            _fail("calibration needs a CUDA GPU: this machine has none, so GPU checks are blocked here")
        ceilings = run_calibration(hw, force=True)
    else:
        ceilings = cached_ceilings(hw) if hw.gpu_count else None
    blocked = views.blocked_checks(Course(), hw)
    from infracourse import sandbox  # why: start-up: loaded on use, not when the CLI starts

    confined = sandbox.status()
    if as_json:
        print(json.dumps({"hardware": hw.as_dict(), "ceilings": ceilings and ceilings.__dict__,
                          "blocked": blocked, "toolchain": toolchain_warnings(hw),
                          "sandbox": {"available": confined.available,
                                                          "describe": confined.describe()}}, indent=1))
        return
    views.print_doctor(console, hw, ceilings, blocked)
    for warning in toolchain_warnings(hw):
        console.print(f"[yellow]{escape(warning)}[/yellow]")
    console.print(f"sandbox for learner code: {escape(confined.describe())}" if confined.available else
                  f"[yellow]sandbox for learner code: {escape(confined.describe())}[/yellow] — your own grades "
                  "still work (unsandboxed); `cohort regrade` needs --allow-unsandboxed here")


def _plan(hw, workspace: Optional[Path], as_json: bool) -> None:
    from dataclasses import asdict

    from infracourse.plan import plan, rent_total
    from infracourse.workspace import Workspace, WorkspaceError  # why: start-up: loaded on use, not when the CLI starts

    try:  # inside a workspace: the weeks not yet passed, and the chosen track's project
        ws = Workspace.find(workspace or _global["workspace"])
        course = Course(track=ws.track)
        done = {w for w, s in ws.progress.weeks_summary().items() if s.get("passed")}
    except WorkspaceError:
        course, done = Course(), set()
    rows = plan(course, hw, done)
    if as_json:
        print(json.dumps({"device": hw.device_name, "weeks": [asdict(r) for r in rows],
                          "rent_minutes_by_gpus": rent_total(rows)}, indent=1))
        return
    console.print(escape(f"this machine: {hw.device_name} (tier {hw.tier})"))
    views.print_plan(console, rows, rent_total(rows))


@_command()
def syllabus(week: Optional[str] = typer.Argument(None), schema: bool = typer.Option(False, "--schema")):
    """The course's weeks (or one week in full); --schema prints the JSON Schema of the course files."""
    if schema:
        from infracourse.schema import json_schema  # why: start-up: loaded on use, not when the CLI starts

        print(json.dumps(json_schema(), indent=1))
        return
    course = Course()
    weeks = [_week(course, week)] if week else course.syllabus.weeks
    views.print_syllabus(console, weeks, detail=week is not None)


# `drill` and `selftest` live in their own module (infracourse.drills.cli); this lends them the guard and lookup
from infracourse.drills.cli import register as _register_drills  # noqa: E402 - typer only, no engine at start-up

_register_drills(app, _command, _context, _fail)


@dev_app.command("check")
@_guarded
def dev_check(week: Optional[str] = typer.Argument(None, help="One week (default: every built lab).")):
    """For course authors: hints exist, no stray files, starter fails, solution passes."""
    from infracourse.dev import check_course  # why: start-up: loaded on use, not when the CLI starts

    problems = check_course(Course(), week, log=lambda m: err.print(f"[dim]{escape(m)}[/dim]"))
    for problem in problems:
        console.print(f"[red]✗[/red] {escape(problem)}")
    if problems:
        raise typer.Exit(1)
    console.print("[green]course OK[/green]")


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
