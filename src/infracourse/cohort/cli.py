"""The instructor's commands (`release`, `cohort ...`) and the learner's `submit`: parse, call one function, print.

Wired into the `infracourse` app by infracourse.cli; the functions they call live beside this module.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from infracourse.cohort import bundle, certificates, deadlines, export, feedback, gradebook, publish, regrade, release
from infracourse.cohort import outcome, roster
from infracourse.cohort import rubric, similarity
from infracourse.cohort import slurm as cluster
from infracourse.course import Course, default_course_root
from infracourse.safe_text import escape  # every learner string shown: control characters out, markup as typed
from infracourse.progress import ProgressError
from infracourse.syllabus import CourseFileError, normalise_week
from infracourse.workspace import Workspace, WorkspaceError

cohort_app = typer.Typer(no_args_is_help=True, help="For instructors: a gradebook of a cohort's submissions, "
                         "regraded on your machine, exported and published as a static site.")
console = Console(soft_wrap=True)  # paths and URLs stay whole, for copying
err = Console(stderr=True, soft_wrap=True)
FAILURES = (outcome.UnsandboxedError, cluster.SlurmError, roster.RosterError, deadlines.DeadlineError,
            bundle.BundleError, gradebook.GradebookError, release.ReleaseError, export.ExportError,
            publish.PublishError, certificates.CertificateError, rubric.RubricError, feedback.FeedbackError, CourseFileError, WorkspaceError, ProgressError, KeyError, OSError)
GradebookOpt = typer.Option(Path(gradebook.DEFAULT_FILE), "--gradebook", "-g",
                            help="The gradebook file (default: gradebook.db in the current folder).")


@contextmanager
def _reported():
    """A failure the user can fix ends the command with one line naming the file and the fix (exit 2)."""
    try:
        yield
    except FAILURES as exc:
        err.print(f"[red]error:[/red] {escape(str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc))}")
        raise typer.Exit(2) from None


def release_command(out: Path = typer.Option(..., "--out", help="New folder for the learner copy."),
                    course: Optional[Path] = typer.Option(None, "--course", help="Course repository (default: "
                                                          "this installation's, or INFRACOURSE_COURSE).")):
    """Write a learner copy of the course with no reference solution in it (checked by content)."""
    with _reported():
        report = release.release(course or default_course_root(), out)
    console.print(f"Learner copy written to [bold]{escape(str(report.out))}[/bold] ({report.files} files).")
    for item in report.removed:
        console.print(escape(f"  left out {item['path']}: {item['reason']}"))


def submit_command(week: str = typer.Argument(..., help="week07, 7 or w7"),
                   learner: Optional[str] = typer.Option(None, "--learner", help="Your id (default: `learner:` in "
                                                         "the workspace's .infracourse/config.yaml)."),
                   workspace: Optional[Path] = typer.Option(None, "--workspace", "-w",
                                                            help="Workspace folder (default: found from here)."),
                   secret_file: Optional[Path] = typer.Option(None, "--secret-file", help="The secret your "
                                                              "instructor sent you (default: `secret:` in the "
                                                              "workspace's .infracourse/config.yaml); it signs the "
                                                              "bundle so no one else can submit as you.")):
    """Bundle a week's files with your last grade and this machine's facts, signed, for your instructor."""
    with _reported():
        ws = Workspace.find(workspace)
        path = bundle.submit(ws, Course(track=ws.track), week, learner=learner, secret_file=secret_file)
    print(path)


def feedback_command(week: str = typer.Argument(..., help="week07, 7 or w7"),
                     site: str = typer.Option(..., "--site", help="The course site your instructor published: its "
                                              "folder or its https:// address."),
                     secret_file: Optional[Path] = typer.Option(None, "--secret-file", help="The secret your "
                                                                "instructor sent you (default: `secret:` in the "
                                                                "workspace's .infracourse/config.yaml)."),
                     workspace: Optional[Path] = typer.Option(None, "--workspace", "-w",
                                                              help="Workspace folder (default: found from here).")):
    """Your instructor's rubric scores and comments on a week, once they publish them (`cohort publish
    --feedback`); only your secret finds and checks them."""
    with _reported():
        week = normalise_week(week)
        if secret_file is not None:
            _, key = roster.parse_secret(secret_file.read_text())
        else:
            ws = Workspace.find(workspace)
            found = bundle.signing_secret(ws, bundle.workspace_config(ws), None)
            if found is None:
                raise roster.RosterError(f"{ws.meta / 'config.yaml'} has no `secret:` line: pass --secret-file with "
                                         "the secret your instructor sent you")
            _, key = found
        reviews = feedback.read(site, key, week)
    if not reviews:
        console.print(f"No finished review of {week} yet (your other weeks' reviews are published).")
    for number, review in enumerate(reviews, start=1):
        table = Table(title=f"{week}, review {number} of {len(reviews)}: {review['points']}/{review['max']} points")
        for column in ("rubric item", "points", "comment"):
            table.add_column(column, overflow="fold")
        for item in review["items"]:
            table.add_row(escape(f"{item['title']} ({item['level']})"), f"{item['points']}/{item['max']}",
                          escape(item["comment"]))
        console.print(table)


@cohort_app.command("init")
def init(gradebook_file: Path = GradebookOpt):
    """Create an empty gradebook (an existing one is left as it is)."""
    existed = gradebook_file.exists()
    with _reported():
        book = gradebook.Gradebook.create(gradebook_file, Course())
    console.print(f"Gradebook {'already at' if existed else 'created at'} [bold]{escape(str(book.path))}[/bold]. "
                  "Next: infracourse cohort import BUNDLE.zip ...")


roster_app = typer.Typer(no_args_is_help=True, help="Who is enrolled, and the secret each learner signs with.")
cohort_app.add_typer(roster_app, name="roster")


@roster_app.command("import")
def roster_import(csv_file: Path = typer.Argument(..., help="CSV with a header row: id, name, email (optional: "
                                                   "sis_user_id, sis_login_id, section, canvas_id, idnumber)."),
                  gradebook_file: Path = GradebookOpt):
    """Add learners (each new one is issued a secret) and update known ones; secrets never change here."""
    with _reported():
        added, updated = gradebook.Gradebook(gradebook_file).import_roster(roster.read_roster(csv_file))
    console.print(f"roster: {added} learner(s) added, {updated} updated. Next: infracourse cohort roster secrets "
                  "--out DIR, and send each learner their DIR/ID.secret")


@roster_app.command("secrets")
def roster_secrets(out: Path = typer.Option(..., "--out", help="New folder: one ID.secret per learner and "
                                            "secrets.csv (for a mail merge). Keep it private."),
                   gradebook_file: Path = GradebookOpt):
    """Write each learner's secret; they pass theirs to `infracourse submit --secret-file`."""
    with _reported():
        written = roster.write_secrets(gradebook.Gradebook(gradebook_file).roster(), out)
    console.print(escape(f"wrote {len(written)} secret file(s) and secrets.csv to {out}"))


@roster_app.command("list")
def roster_list(gradebook_file: Path = GradebookOpt):
    """The roster (without secrets)."""
    with _reported():
        entries = gradebook.Gradebook(gradebook_file).roster()
    table = Table(title=f"{len(entries)} learner(s)")
    for column in ("id", "name", "email", "section"):
        table.add_column(column, overflow="fold")
    for learner, _ in entries:
        table.add_row(*map(escape, (learner.id, learner.name, learner.email, learner.section)))
    console.print(table)


def bundle_paths(sources: List[str]) -> tuple[int, "Iterator[Path]"]:
    """(count, paths) of the bundles named: files, folders (every .zip below, by name) and glob patterns the
    tool expands itself (quote them: `cohort import 'inbox/*.zip'` never meets the shell's argument limit)."""
    import glob

    def expand():
        for source in sources:
            if any(ch in source for ch in "*?["):
                yield from sorted(Path(p) for p in glob.iglob(source, recursive=True) if p.endswith(".zip"))
            elif Path(source).is_dir():
                yield from sorted(Path(source).rglob("*.zip"))
            else:
                yield Path(source)

    return sum(1 for _ in expand()), expand()


@cohort_app.command("import")
def import_(bundles: List[str] = typer.Argument(..., help="Submission .zip files, folders of them, or quoted "
                                                "glob patterns ('inbox/*.zip')."),
            keep_going: bool = typer.Option(False, "--keep-going", help="Record the valid bundles even if "
                                            "others are rejected (default: all or nothing)."),
            received_at: Optional[str] = typer.Option(None, "--received-at", help="When these bundles reached "
                                                      "you, UTC (2026-02-02T23:59:00Z), if before now (e.g. an "
                                                      "LMS download): lateness is judged on it."),
            unsigned: bool = typer.Option(False, "--unsigned", help="No roster: accept learner ids as the bundles "
                                          "claim them."),
            jobs: int = typer.Option(1, "--jobs", min=1, help="Processes reading and checking bundles ahead of the "
                                     "one writing (measured: no faster on 2 cores, where writing is the bottleneck)."),
            gradebook_file: Path = GradebookOpt):
    """Validate bundles and record them; each bad one is rejected with its reason."""
    if received_at is not None and deadlines.parse_time(received_at) is None:
        err.print(f"[red]error:[/red] --received-at {escape(received_at)!r} is not a time like 2026-02-02T23:59:00Z")
        raise typer.Exit(2)
    with _reported():
        book, course = gradebook.Gradebook(gradebook_file), Course()
        count, paths = bundle_paths(bundles)
        with Progress(TextColumn("importing"), BarColumn(), MofNCompleteColumn(), console=err, transient=True) as bar:
            task = bar.add_task("import", total=count)
            report = book.import_bundles(paths, course, keep_going=keep_going, received_at=received_at,
                                         require_roster=not unsigned,
                                         jobs=jobs,
                                         on_bundle=lambda path, problem: bar.advance(task))
    for problem in report.rejected:
        console.print(f"[red]rejected[/red] {escape(str(problem))}")
    if report.committed:
        console.print(f"[green]imported {len(report.imported)} bundle(s)[/green]")
    elif report.rejected:
        console.print("nothing imported: the gradebook is as it was." + (
            f" Fix or leave out the rejected bundle(s), or pass --keep-going to record the {len(report.imported)} "
            "valid one(s)." if report.imported and not keep_going else ""))
    raise typer.Exit(1 if report.rejected else 0)


@cohort_app.command("regrade")
def regrade_(week: Optional[str] = typer.Option(None, "--week", help="Only this week."),
             learner: Optional[str] = typer.Option(None, "--learner", help="Only this learner."),
             again: bool = typer.Option(False, "--again", help="Also submissions already verified on this machine."),
             allow_unsandboxed: bool = typer.Option(False, "--allow-unsandboxed", help="Regrade even where no "
                                                    "sandbox works (learner code then runs with your rights); "
                                                    "such results are marked unsandboxed."),
             workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Grading processes on this "
                                                   "machine (default: one per GPU, else 1)."),
             slurm: bool = typer.Option(False, "--slurm", help="Run the regrade as a Slurm job array from this "
                                        "login node (the course, this Python and the gradebook's folder must be "
                                        "on a filesystem the nodes share)."),
             partition: Optional[str] = typer.Option(None, "--partition", help="Slurm partition."),
             time_limit: Optional[str] = typer.Option(None, "--time", help="Slurm time limit per array task."),
             array_limit: Optional[int] = typer.Option(None, "--array-limit", min=1, help="At most this many "
                                                       "array tasks at once."),
             tasks: Optional[int] = typer.Option(None, "--tasks", min=1, help="Array tasks (default: one per 4 "
                                                 "submissions, at most 500)."),
             sbatch_arg: List[str] = typer.Option([], "--sbatch-arg", help="Passed to sbatch as is, e.g. "
                                                  "--sbatch-arg=--gres=gpu:1 (repeatable)."),
             gradebook_file: Path = GradebookOpt):
    """Re-run the graders on this machine for each learner's newest submission; mark the results verified."""
    options = None
    if slurm:
        options = cluster.SlurmOptions(partition=partition, time=time_limit, array_limit=array_limit, tasks=tasks,
                                       sbatch_args=list(sbatch_arg))
    elif partition or time_limit or array_limit or tasks or sbatch_arg:
        err.print("[red]error:[/red] --partition, --time, --array-limit, --tasks and --sbatch-arg need --slurm")
        raise typer.Exit(2)
    with _reported():
        done = regrade.regrade(gradebook.Gradebook(gradebook_file), Course(), week=week, learner=learner,
                               again=again, allow_unsandboxed=allow_unsandboxed, workers=workers, slurm=options,
                               on_submission=lambda s: err.print(f"[dim]{escape(f'regrading {s.learner} {s.week}')}[/dim]"),
                               on_note=lambda note: err.print(f"[yellow]{escape(note)}[/yellow]"))
    table = Table(title=f"regraded {len(done)} submission(s)")
    for column in ("learner", "week", "self-reported", "verified", "disagreements"):
        table.add_column(column, overflow="fold")
    for r in done:
        verified = f"error: {r.error}" if r.error else _passed(r.verified)
        table.add_row(*map(escape, (r.submission.learner, r.submission.week,
                                    _passed(r.self_reported) if r.self_reported else "",
                                    verified + ("" if r.verified.sandboxed else " (unsandboxed)")
                                    + _flagged(r.verified.provenance),
                                    export.describe(r.disagreements))))
    console.print(table)
    errors = [r for r in done if r.error]
    if errors:
        console.print(f"[red]{len(errors)} submission(s) could not be graded[/red] (recorded as error; the others "
                      "were graded). Fix the cause, then `cohort regrade --again --learner ID --week W`.")


def _flagged(findings: list[str]) -> str:
    """The regrade table's note of constructs that reach the grading worker (grading.provenance): read the file.
    Each finding reads 'file:line: construct: fix'; the table shows where and what."""
    if not findings:
        return ""
    where, construct = (findings[0].split(": ", 2) + [""])[:2]
    more = f"; {len(findings) - 1} more" if len(findings) > 1 else ""
    return f" (flagged: {where} {construct}{more}: read the file)"


@cohort_app.command("export")
def export_(out: Path = typer.Option(..., "--out", help="FILE.csv or FILE.json"),
            format: Optional[str] = typer.Option(None, "--format", help="csv, json (default: by the file's "
                                                 "suffix), canvas or moodle (an LMS grade-import CSV)."),
            gradebook_file: Path = GradebookOpt):
    """One row per learner x week: checks passed, verified, disagreements, best figures, lateness, points."""
    with _reported():
        path = export.export(gradebook.Gradebook(gradebook_file), Course(), out, format=format)
    console.print(escape(f"wrote {path}"))


@cohort_app.command("similar")
def similar_(week: Optional[str] = typer.Option(None, "--week", help="Only this week."),
             threshold: float = typer.Option(0.8, "--threshold", min=0.1, max=1.0, help="Share of the smaller "
                                             "submission's fingerprints two must share to be listed as near."),
             out: Optional[Path] = typer.Option(None, "--out", help="Also write the matches to FILE.csv."),
             gradebook_file: Path = GradebookOpt):
    """Identical and near-identical submissions of the same week (for you only: never published)."""
    with _reported():
        matches = similarity.similar(gradebook.Gradebook(gradebook_file), Course(),
                                     week=week and normalise_week(week), threshold=threshold)
        if out:
            similarity.write_csv(matches, out)
    table = Table(title=f"{len(matches)} match(es): a reason to look, not a verdict")
    for column in ("week", "kind", "score", "learners", "detail"):
        table.add_column(column, overflow="fold")
    for m in matches:
        table.add_row(*map(escape, (m.week, m.kind, f"{m.score:.0%}", " ".join(m.learners), m.detail)))
    console.print(table)
    if out:
        console.print(escape(f"wrote {out}"))


@cohort_app.command("publish")
def publish_(out: Path = typer.Option(..., "--out", help="Folder for the static site."),
             pseudonyms: bool = typer.Option(False, "--pseudonyms", help="Show stable pseudonyms, not learner ids."),
             stuck_attempts: int = typer.Option(3, "--stuck-attempts", min=1, help="Stuck: the same check failed "
                                                "in this many submissions in a row."),
             idle_days: int = typer.Option(7, "--idle-days", min=1, help="Stuck: no submission for this many days."),
             feedback: bool = typer.Option(False, "--feedback", help="Show each learner, on their own page, the "
                                           "rubric scores and comments of `cohort review` (finished reviews only)."),
             gradebook_file: Path = GradebookOpt):
    """Write the cohort site: learners x weeks dashboard, who is stuck, week pages, learner drill-downs,
    kernel-week leaderboards (works from file://)."""
    with _reported():
        site = publish.publish(gradebook.Gradebook(gradebook_file), Course(), out, pseudonyms=pseudonyms,
                               stuck_attempts=stuck_attempts, idle_days=idle_days, feedback=feedback)
    console.print(escape(f"site written to {site}; open {(site / 'index.html').resolve().as_uri()}"))


@cohort_app.command("review")
def review_(week: Optional[str] = typer.Option(None, "--week", help="Only this week's submissions."),
            status: bool = typer.Option(False, "--status", help="Print how many remain per week and reviewer, "
                                        "and exit."),
            reviewer: str = typer.Option(os.environ.get("USER") or "instructor", "--reviewer", help="Your name in "
                                         "the gradebook's scores (default: $USER); give each reviewer the URL with "
                                         "their own name in it."),
            port: int = typer.Option(0, "--port", min=0, max=65535, help="Port on 127.0.0.1 (default: a free one)."),
            names: bool = typer.Option(False, "--names", help="Show learner ids (default: pseudonyms)."),
            gradebook_file: Path = GradebookOpt):
    """Score reports by the week's rubric in your browser: a local app on 127.0.0.1, one URL with a token."""
    from infracourse.cohort import review  # FastAPI's import cost only for this command

    with _reported():
        book, course = gradebook.Gradebook(gradebook_file), Course()
        week = week and normalise_week(week)
        if status:
            table = Table(title="review: submissions left (newest per learner and week with a rubric)")
            for column in ("week", "submissions", "no reviewer finished", "finished, by reviewer"):
                table.add_column(column, overflow="fold")
            for r in rubric.status(book, course, week=week):
                table.add_row(r.week, str(r.submissions), str(r.unreviewed),
                              ", ".join(f"{who} {n}" for who, n in sorted(r.finished.items())) or "-")
            console.print(table)
            return
        app = review.Review(book, course, week=week, anonymous=not names)
        review.serve(app, port=port, reviewer=reviewer, on_ready=lambda url: console.print(
            f"Review app on this machine only; open [bold]{escape(url)}[/bold] (the token in it is the key: "
            "share it only with your reviewers, each with their own reviewer= name). Ctrl-C stops it."))


def _passed(result) -> str:
    return f"{result.count('passed')}/{len(result.checks)}" + (" complete" if result.complete else "")


@cohort_app.command("verify-certificate")
def verify_certificate_(certificate: Path = typer.Argument(..., help="The learner's completion.json (from "
                                                           "`infracourse status --completion --certificate DIR`)."),
                        learner: Optional[str] = typer.Option(None, "--learner", help="Their id in the gradebook "
                                                              "(default: the one the certificate names)."),
                        gradebook_file: Path = GradebookOpt):
    """Check a learner's completion certificate against your regrades of their newest submissions (a week not
    regraded counts as not graded). Exit 0: every claim is borne out; 1: problems, listed; 2: bad input."""
    with _reported():
        cert = certificates.load_certificate(certificate)
        who, results, problems = certificates.verify(gradebook.Gradebook(gradebook_file), Course(), cert, learner)
    weeks = ", ".join(sorted(results)) or "none"
    console.print(escape(f"{certificate}: {who}, checked against the verified grades of week(s) {weeks}"))
    if not results:
        console.print(escape(f"no submission of {who} is regraded yet: run `infracourse cohort regrade --learner "
                             f"{who}` first; every claim of 'met' is unverified until then"))
    for problem in problems:
        console.print(f"[red]not borne out[/red] {escape(problem)}")
    if problems:
        console.print(f"{len(problems)} problem(s): the certificate claims more than your regrades show.")
        raise typer.Exit(1)
    console.print("[green]verified[/green]: every criterion and check the certificate claims is borne out by your "
                  "regrades.")
