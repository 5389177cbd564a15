"""What the CLI shows: tables and summaries built from course, workspace and grade data.

Every piece of text that is not this module's own (messages, hints, titles, paths, ids) goes through
`escape` before rich renders it: a learner's `[/i]` or `[bold]` is shown as typed, never read as markup, and
terminal control characters (ANSI escapes, `\r`) are removed.
Course types are imported for annotations only, so that importing this module stays cheap.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from infracourse.safe_text import escape  # control characters stripped, markup shown as typed

if TYPE_CHECKING:
    from infracourse.course import Course
    from infracourse.grading.results import GradeResult
    from infracourse.hardware import Ceilings, Hardware
    from infracourse.syllabus import Week
    from infracourse.workspace import UnlockReport, Workspace

STATUS_STYLE = {"passed": "green", "failed": "red", "error": "magenta", "blocked": "yellow"}


def print_unlock(console: Console, course: Course, report: UnlockReport) -> None:
    week = report.week
    state = "unlocked" if report.newly_unlocked else "already unlocked"
    if week.planned:
        console.print(f"{escape(week.id)} — {escape(week.title)}: {state}. Its lab is [bold]planned[/bold] (not built yet), so "
                      "there are no files; `infracourse next` now moves past it.")
        return
    console.print(f"[bold]{escape(week.id)} — {escape(week.title)}[/bold] {state} in {escape(str(report.folder))}")
    if report.copied:
        console.print("  copied: " + escape(", ".join(report.copied)))
    if report.kept:
        console.print("  [yellow]kept your changed files:[/yellow] " + escape(", ".join(report.kept)) +
                      escape(f" (`infracourse reset {week.id}` restores the starter, backing yours up)"))
    lab = course.lab(week).spec
    console.print("  read: " + escape(", ".join(lab.read)))
    console.print("  edit: " + escape(", ".join(lab.files)))
    console.print(escape(f"  then: infracourse grade {week.id}   (stuck? infracourse hint {week.id})"))


def status_rows(ws: Workspace, course: Course) -> list[dict]:
    unlocked = ws.progress.unlocked()
    summary = ws.progress.weeks_summary()
    rows = []
    for week in course.syllabus.weeks:
        done = summary.get(week.id, {})
        last = ws.progress.last_grade(week.id) if done else None
        if done.get("verified_on_gpu"):
            state = "verified-on-GPU"
        elif done.get("passed"):
            state = "passed"
        elif week.id in unlocked:
            state = "unlocked"
        else:
            state = "locked"
        rows.append({
            "week": week.id, "title": week.title, "lab": "planned" if week.planned else "ready", "state": state,
            "attempts": done.get("attempts", 0),
            "last_grade": last and {"at": last.started_at, "tier": last.tier, "passed": last.count("passed"),
                                    "checks": len(last.checks), "blocked": last.count("blocked"),
                                    "complete": last.complete},
        })
    return rows


def next_step(ws: Workspace, course: Course) -> str:
    """The one command to run next: keep working on the first unlocked week not yet passed, else unlock one."""
    summary = ws.progress.weeks_summary()
    unlocked = ws.progress.unlocked()
    for week in course.syllabus.weeks:
        if week.id in unlocked and not week.planned and not summary.get(week.id, {}).get("passed"):
            return f"infracourse watch {week.id}   ({week.title}; stuck? infracourse hint {week.id})"
    week = ws.next_week(course)
    if week is None:
        return ("every week is unlocked and passed: `infracourse status --completion` shows the course's completion "
                "criteria; `infracourse submit WEEK` sends a week to your instructor")
    if week.on_track and course.track_id is None:
        return f"infracourse track list   (weeks 22-24 are the project of the track you choose; then unlock {week.id})"
    return f"infracourse next   (unlocks {week.id}: {week.title})"


def print_tracks(console: Console, course: Course, chosen: str | None) -> None:
    table = Table(title="the direction tracks of weeks 22-24")
    for column in ("track", "project", "checks (week 22 / 23 / 24)"):
        table.add_column(column, overflow="fold")
    for track in course.tracks.values():
        mark = " [bold green](chosen)[/]" if track.id == chosen else ""
        table.add_row(escape(track.id) + mark, f"[bold]{escape(track.title)}[/bold]\n{escape(track.summary)}",
                      " / ".join(str(len(track.weeks[w])) for w in ("week22", "week23", "week24")))
    console.print(table)
    console.print("choose with `infracourse track choose NAME`; a check that needs hardware you lack is blocked "
                  "and listed as to be verified in your report, never simulated")


def print_completion(console: Console, cert: dict) -> None:
    colour = {"met": "green", "met, to be verified": "yellow", "not met": "red"}
    table = Table(title="completion criteria" + (f" — track {escape(cert['track'])}" if cert["track"] else ""))
    for column in ("criterion", "state", "backed by (week:check status)"):
        table.add_column(column, overflow="fold")
    for c in cert["criteria"]:
        table.add_row(escape(c["text"]), f"[{colour[c['state']]}]{escape(c['state'])}[/]",
                      escape(", ".join(f"{b['week']}:{b['check']} {b['status']}" for b in c["backing"])))
    console.print(table)
    met = sum(c["state"] != "not met" for c in cert["criteria"])
    console.print(f"{progress_bar(met, len(cert['criteria']))} {met}/{len(cert['criteria'])} criteria met" +
                  (escape(f"; to be verified on hardware you lack: {', '.join(cert['to_be_verified'])}")
                   if cert["to_be_verified"] else ""))


def progress_bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * done / total) if total else 0
    return "█" * filled + "░" * (width - filled)


def print_status(console: Console, rows: list[dict], next_command: str) -> None:
    """The weeks table, one line of overall progress, and the next step. No hardware probe here (it would
    import torch): each grade's own tier and device are in its row."""
    table = Table(title="infracourse — your progress")
    for column in ("week", "title", "state", "last grade", "blocked"):
        table.add_column(column)
    colour = {"verified-on-GPU": "bold green", "passed": "green", "unlocked": "cyan", "locked": "dim"}
    for row in rows:
        last = row["last_grade"]
        title = escape(row["title"]) + (" [dim](planned)[/dim]" if row["lab"] == "planned" else "")
        table.add_row(escape(row["week"]), title, f"[{colour[row['state']]}]{row['state']}[/]",
                      escape(_last_grade(row)), str(last["blocked"]) if last and last["blocked"] else "")
    console.print(table)
    built = [r for r in rows if r["lab"] != "planned"]
    passed = sum(r["state"] in ("passed", "verified-on-GPU") for r in built)
    verified = sum(r["state"] == "verified-on-GPU" for r in built)
    console.print(f"{progress_bar(passed, len(built))} {passed}/{len(built)} built weeks passed, "
                  f"{verified} verified on GPU")
    console.print(f"next: {escape(next_command)}")


def _last_grade(row: dict) -> str:
    """The status table's cell: the last whole grade, and, where the week passed in an earlier grade but not in
    this one, that it is not complete now (a `passed` beside 3/10 read as a contradiction)."""
    last = row["last_grade"]
    if not last:
        return ""
    cell = f"{last['passed']}/{last['checks']} passed on {last['tier']}, {last['at']}"
    if row["state"] in ("passed", "verified-on-GPU") and not last["complete"]:
        cell += "; not complete now (the week passed in an earlier grade)"
    return cell


def _figure(check) -> tuple[str, str]:
    """(measured, target) of the figure the check's verdict rests on, the measured value named: a bare number
    means nothing. That is the first figure with a target (a check that records a prefill time before the
    speed-up it judges shows the speed-up), else the first one; a target that is the grader's own measurement
    of the same work reads 're-measured', not as a bar to beat."""
    if not check.figures:
        return "", ""
    name, head = next(((n, f) for n, f in check.figures.items() if f.target is not None),
                      next(iter(check.figures.items())))
    measured, target = head.shown()
    kind = head.detail.get("target_is")
    return f"{name}: {measured}", f"{kind} {target}" if target and kind else target


FIGURE_COLUMNS = ("measured: the figure the check judged (the first with a target, else the first recorded), named, "
                  "from your code; target: the bar it had to meet, or, marked 're-measured', what the grader itself "
                  "measured of the same work in this grade (it moves with the machine's load); every figure is in "
                  ".grade/result.json in the week's folder, or `grade --json`")


def print_grade(console: Console, result: GradeResult, plots: list[Path] = ()) -> None:
    table = Table(title=escape(f"{result.week} on {result.device} (tier {result.tier}) — {result.seconds:.1f} s"),
                  caption=FIGURE_COLUMNS if any(c.figures for c in result.checks) else None)
    for column in ("check", "status", "measured", "target", "message"):
        table.add_column(column, overflow="fold")
    for check in result.checks:
        measured, target = _figure(check)
        table.add_row(escape(check.id), f"[{STATUS_STYLE[check.status]}]{check.status}[/]", escape(measured),
                      escape(target), escape(check.message))
    console.print(table)
    counts = ", ".join(f"{result.count(s)} {s}" for s in STATUS_STYLE if result.count(s))
    if result.partial:
        style = "bold green" if result.all_passed else "bold red"
        console.print(f"[{style}]{escape(summary_line(result).split(' — ')[0])}[/{style}]. "
                      f"{escape(PARTIAL_NOTE.format(week=result.week))}")
    elif result.complete:
        extra = " and verified on GPU" if result.verified_on_gpu else \
            (f"; {result.count('blocked')} check(s) need hardware this machine lacks" if result.count("blocked") else "")
        console.print(f"[bold green]{escape(result.week)} complete[/bold green]{escape(extra)} ({counts}).")
    else:
        console.print(f"[bold red]{escape(result.week)} not complete[/bold red] ({counts}). "
                      f"Read the messages above; `infracourse hint {escape(result.week)}` helps.")
    if not result.sandboxed:
        console.print(f"[yellow]{UNSANDBOXED}[/yellow]")
    for plot in plots:
        console.print(f"plot: {escape(str(plot))}")


UNSANDBOXED = ("ran unsandboxed: no sandbox works on this machine (see `infracourse doctor`), so your code ran "
               "with your own rights; fine for your own grade, but an instructor's regrade runs it sandboxed")


PARTIAL_NOTE = "A partial grade never completes the week: `infracourse grade {week}` grades every check"


def summary_line(result: GradeResult) -> str:
    counts = ", ".join(f"{result.count(s)} {s}" for s in STATUS_STYLE if result.count(s))
    verdict = (f"partial grade of {len(result.checks)} check(s)" if result.partial else
               "complete" if result.complete else "not complete")
    return f"{result.week} {verdict}: {counts} — {result.seconds:.1f} s on {result.device}" + \
        ("" if result.sandboxed else " (ran unsandboxed)")


def print_watch(console: Console, result: GradeResult, next_command: str | None) -> None:
    """What `watch` shows after each grade: one summary line, then only what needs work, then what next."""
    style = "bold green" if result.complete or (result.partial and result.all_passed) else "bold red"
    console.print(f"[{style}]{escape(summary_line(result))}[/{style}]")
    if result.partial:
        console.print(f"[dim]{escape(PARTIAL_NOTE.format(week=result.week))}[/dim]")
    for check in result.checks:
        if check.status in ("failed", "error"):
            console.print(f"[{STATUS_STYLE[check.status]}]✗ {escape(check.id)}[/] ({check.status}): "
                          f"{escape(check.message)}")
    blocked = [c.id for c in result.checks if c.status == "blocked"]
    if blocked:
        console.print(f"[yellow]blocked here[/yellow] (need other hardware): {escape(', '.join(blocked))}")
    if result.complete and next_command:
        console.print(f"[bold]next:[/bold] {escape(next_command)}")
    elif not result.complete:
        console.print(escape(f"stuck? infracourse hint {result.week}"))


def print_hints(console: Console, hints: list[str], total: int) -> None:
    for i, text in enumerate(hints, 1):
        console.print(f"[bold]Hint {i}/{total}:[/bold] {escape(text)}")
    if len(hints) == total:
        console.print("[dim]That was the last hint.[/dim]")


def write_plots(folder: Path, result: GradeResult) -> list[Path]:
    """Kernel weeks get roofline and per-shape plots beside the learner's files (when figures allow)."""
    try:
        # why: start-up: views loads with the CLI; plots and hardware only when a grade draws
        from infracourse.grading.plots import write_kernel_plots
    except ImportError:
        return []
    # why: start-up: views loads with the CLI; plots and hardware only when a grade draws
    from infracourse.hardware import cached_ceilings, detect

    hw = detect() if result.tier != "cpu" else None
    ceilings = cached_ceilings(hw) if hw else None
    return write_kernel_plots(result, ceilings, folder / ".grade")




def blocked_checks(course: Course, hw: Hardware) -> dict[str, list[str]]:
    """Per built week, the checks this machine cannot run."""
    blocked = {}
    for lab in course.labs():
        missing = [f"{c.id} ({hw.missing(c.needs)})" for c in lab.spec.checks if not hw.satisfies(c.needs)]
        if missing:
            blocked[lab.spec.week] = missing
    return blocked


def print_doctor(console: Console, hw: Hardware, ceilings: Ceilings | None, blocked: dict[str, list[str]]) -> None:
    table = Table(title="infracourse doctor", show_header=False)
    for key, value in hw.as_dict().items():
        table.add_row(escape(key), escape(str(value)))
    console.print(table)
    if ceilings:
        rates = ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in ceilings.matmul_tflops.items())
        console.print(f"ceilings ({ceilings.measured_at}, {ceilings.seconds:.1f} s to measure): copy "
                      f"{ceilings.copy_gbps:.0f} GB/s; matmul {rates}")
    elif hw.gpu_count:
        console.print("ceilings: not measured yet — `infracourse doctor --calibrate` (the first GPU grade does it too)")
    total = sum(len(v) for v in blocked.values())
    if total:
        console.print(f"[yellow]{total} check(s) will be blocked here[/yellow] (they need hardware this machine lacks):")
        for week, checks in blocked.items():
            console.print(escape(f"  {week}: " + "; ".join(checks)))
    else:
        console.print("[green]every built check can run on this machine[/green]")


def print_plan(console: Console, rows: list, totals: dict[int, float]) -> None:
    """`doctor --plan`: per remaining week, what runs here, what is blocked, what to rent."""
    table = Table(title="the weeks ahead on this machine")
    for column in ("week", "runs here", "blocked here (why)", "to rent"):
        table.add_column(column, overflow="fold")
    for row in rows:
        if row.note:
            table.add_row(escape(row.week), f"[dim]{escape(row.note)}[/dim]", "", "")
            continue
        rent = (f"{row.rent.devices} GPU{'s' if row.rent.devices > 1 else ''}, ~{row.rent.minutes:g} min, "
                f"{row.rent.memory_gib:g} GiB" if row.rent else "")
        table.add_row(escape(row.week), str(len(row.runs)),
                      escape("; ".join(f"{c} ({why.split(';')[0]})" for c, why in row.blocked)), escape(rent))
    console.print(table)
    if totals:
        console.print("to rent for what is blocked here: " + ", ".join(
            f"~{m:g} device-minutes on {d}-GPU machines" for d, m in sorted(totals.items())) +
            " (minutes: the reference's grades on an H200, a few attempts); decide the experiments and a stop "
            "condition before renting")
    else:
        console.print("[green]no GPU to rent for the weeks ahead[/green]")


def print_syllabus(console: Console, weeks: list[Week], detail: bool) -> None:
    if not detail:
        table = Table(title="infracourse syllabus")
        for column in ("week", "phase", "title", "hours", "lab"):
            table.add_column(column)
        for w in weeks:
            table.add_row(*(escape(x) for x in (w.id, w.phase, w.title, f"{w.hours:g}", w.lab)))
        console.print(table)
        return
    w = weeks[0]
    console.print(f"[bold]{escape(w.id)} — {escape(w.title)}[/bold]  "
                  + escape(f"({w.phase}; about {w.hours:g} h; lab: {w.lab})"))
    console.print("Objectives:\n" + "\n".join(f"  • {escape(o)}" for o in w.objectives))
    if w.readings:
        console.print("Readings:\n" + "\n".join(f"  • {escape(r.title)} — {escape(r.url)}" for r in w.readings))
    if w.acceptance:
        console.print("Acceptance:\n" + "\n".join(
            f"  • {escape(a.text)}" + (f" [dim](checks: {escape(', '.join(a.checks))})[/dim]" if a.checks else "")
            for a in w.acceptance))

