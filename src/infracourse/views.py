"""What the CLI shows: tables and summaries built from course, workspace and grade data."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

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
        console.print(f"{week.id} — {week.title}: {state}. Its lab is [bold]planned[/bold] (not built yet), so "
                      "there are no files; `infracourse next` now moves past it.")
        return
    console.print(f"[bold]{week.id} — {week.title}[/bold] {state} in {report.folder}")
    if report.copied:
        console.print("  copied: " + ", ".join(report.copied))
    if report.kept:
        console.print("  [yellow]kept your changed files:[/yellow] " + ", ".join(report.kept) +
                      f" (`infracourse reset {week.id}` restores the starter, backing yours up)")
    lab = course.lab(week).spec
    console.print("  read: " + ", ".join(lab.read))
    console.print("  edit: " + ", ".join(lab.files))
    console.print(f"  then: infracourse grade {week.id}   (stuck? infracourse hint {week.id})")


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


def print_status(console: Console, rows: list[dict], hw: Hardware) -> None:
    table = Table(title=f"infracourse — this machine: tier {hw.tier}, {hw.device_name}")
    for column in ("week", "title", "state", "last grade", "blocked"):
        table.add_column(column)
    colour = {"verified-on-GPU": "bold green", "passed": "green", "unlocked": "cyan", "locked": "dim"}
    for row in rows:
        last = row["last_grade"]
        title = row["title"] + (" [dim](planned)[/dim]" if row["lab"] == "planned" else "")
        table.add_row(row["week"], title, f"[{colour[row['state']]}]{row['state']}[/]",
                      f"{last['passed']}/{last['checks']} passed on {last['tier']}, {last['at']}" if last else "",
                      str(last["blocked"]) if last and last["blocked"] else "")
    console.print(table)


def _figure(check) -> tuple[str, str]:
    head = check.headline
    if not head or head.get("value") is None:
        return "", ""
    unit = head.get("unit") or ""
    target = head.get("target")
    return f"{head['value']:.4g} {unit}".strip(), (f"{target:.4g} {unit}".strip() if target is not None else "")


def print_grade(console: Console, result: GradeResult, plots: list[Path] = ()) -> None:
    table = Table(title=f"{result.week} on {result.device} (tier {result.tier}) — {result.seconds:.1f} s")
    for column in ("check", "status", "measured", "target", "message"):
        table.add_column(column, overflow="fold")
    for check in result.checks:
        measured, target = _figure(check)
        table.add_row(check.id, f"[{STATUS_STYLE[check.status]}]{check.status}[/]", measured, target, check.message)
    console.print(table)
    counts = ", ".join(f"{result.count(s)} {s}" for s in STATUS_STYLE if result.count(s))
    if result.complete:
        extra = " and verified on GPU" if result.verified_on_gpu else \
            (f"; {result.count('blocked')} check(s) need hardware this machine lacks" if result.count("blocked") else "")
        console.print(f"[bold green]{result.week} complete[/bold green]{extra} ({counts}).")
    else:
        console.print(f"[bold red]{result.week} not complete[/bold red] ({counts}). "
                      f"Read the messages above; `infracourse hint {result.week}` helps.")
    for plot in plots:
        console.print(f"plot: {plot}")


def write_plots(folder: Path, result: GradeResult) -> list[Path]:
    """Kernel weeks get roofline and per-shape plots beside the learner's files (when figures allow)."""
    try:
        from infracourse.grading.plots import write_kernel_plots
    except ImportError:
        return []
    from infracourse.hardware import cached_ceilings, detect

    hw = detect() if result.tier != "cpu" else None
    ceilings = cached_ceilings(hw) if hw else None
    return write_kernel_plots(result.as_dict(), ceilings, folder / ".grade")


def folder_stamp(folder: Path) -> tuple:
    """A value that changes whenever a file in the folder is saved."""
    return tuple(sorted((str(p), p.stat().st_mtime_ns) for p in folder.rglob("*")
                        if p.is_file() and ".grade" not in p.parts and ".backup-" not in str(p)))


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
        table.add_row(key, str(value))
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
            console.print(f"  {week}: " + "; ".join(checks))
    else:
        console.print("[green]every built check can run on this machine[/green]")


def print_syllabus(console: Console, weeks: list[Week], detail: bool) -> None:
    if not detail:
        table = Table(title="infracourse syllabus")
        for column in ("week", "phase", "title", "hours", "lab"):
            table.add_column(column)
        for w in weeks:
            table.add_row(w.id, w.phase, w.title, f"{w.hours:g}", w.lab)
        console.print(table)
        return
    w = weeks[0]
    console.print(f"[bold]{w.id} — {w.title}[/bold]  ({w.phase}; about {w.hours:g} h; lab: {w.lab})")
    console.print("Objectives:\n" + "\n".join(f"  • {o}" for o in w.objectives))
    if w.readings:
        console.print("Readings:\n" + "\n".join(f"  • {r.title} — {r.url}" for r in w.readings))
    if w.acceptance:
        console.print("Acceptance:\n" + "\n".join(
            f"  • {a.text}" + (f" [dim](checks: {', '.join(a.checks)})[/dim]" if a.checks else "")
            for a in w.acceptance))

