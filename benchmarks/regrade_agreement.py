"""The same verdict whatever the load: grade each week's reference solution as a learner would (one grade at a
time), bundle it, then regrade every bundle at once with the instructors' `infracourse cohort regrade --workers N`
and compare, per bundle and check, the self-reported verdict with the verified one (issue 29).

    python benchmarks/regrade_agreement.py                         # every week this machine grades, 4 workers
    python benchmarks/regrade_agreement.py week01 week21 --workers 2
    python benchmarks/regrade_agreement.py week21 --copies 4 --workers 4   # 4 bundles of week 21 at once

Weeks by default: every built week with at least one check (report checks aside) this machine can run (a check
whose `needs` it lacks is `blocked` on both sides and compares nothing). `--copies K` bundles each reference K
times under different learner ids, so that one week's grades meet each other in the regrade.

Prints one line per bundle (self-reported and verified: checks passed of those run, the others named with their
status; every disagreement with the check, both statuses and the verified message), then the totals and the
times. Exit 0: no disagreement and no bundle the regrade could not grade; 1: some; 2: bad arguments. Nothing of
the course is changed: the bundles and the gradebook live in a scratch folder (kept with --keep DIR).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infracourse import __version__
from infracourse.cohort.bundle import executable_files, graders_digest, learner_files, write_bundle
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.outcome import compare
from infracourse.course import Course
from infracourse.grading.report import stamp_environment
from infracourse.grading.results import GradeResult
from infracourse.grading.runner import grade
from infracourse.hardware import detect


def runnable_here(lab, hw) -> bool:
    return any(c.kind != "report" and hw.satisfies(c.needs) for c in lab.spec.checks)


def verdict(result: GradeResult | None) -> str:
    """'7/8 passed (report failed)': of the checks that ran, those passed, then the others with their status."""
    if result is None:
        return "none"
    ran = [c for c in result.checks if c.status != "blocked"]
    others = ", ".join(f"{c.id} {c.status}" for c in ran if c.status != "passed")
    return f"{sum(c.status == 'passed' for c in ran)}/{len(ran)} passed" + (f" ({others})" if others else "")


def self_grade(course, lab, hw, scratch: Path) -> tuple[GradeResult, dict[str, bytes], float]:
    """The learner's side: the reference copied, its report stamped with this machine, graded alone."""
    folder = scratch / "work" / lab.spec.week
    shutil.copytree(lab.solution, folder)
    if lab.spec.report and (folder / lab.spec.report).exists():
        stamp_environment(folder / lab.spec.report, hw)
    began = time.perf_counter()
    result = grade(course, lab, folder, hardware=hw)
    return result, learner_files(folder), time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("weeks", nargs="*", help="weekNN (default: every week this machine grades)")
    parser.add_argument("--workers", type=int, default=4, help="cohort regrade --workers (default 4)")
    parser.add_argument("--copies", type=int, default=1, help="bundles of each week's reference (default 1)")
    parser.add_argument("--keep", type=Path, help="keep the bundles and the gradebook in this folder")
    args = parser.parse_args()
    if args.workers < 1 or args.copies < 1:
        parser.error("--workers and --copies must be at least 1")
    course, hw = Course(), detect()
    labs = [course.lab(w) for w in args.weeks] if args.weeks else [lab for lab in course.labs()
                                                                   if runnable_here(lab, hw)]
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="regrade-agreement-"))
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"device: {hw.device_name}; {os.cpu_count()} CPU(s); load {os.getloadavg()[0]:.1f}; "
          f"{len(labs)} week(s) x {args.copies} bundle(s), cohort regrade --workers {args.workers}", flush=True)
    bundles = []
    for lab in labs:
        result, files, took = self_grade(course, lab, hw, scratch)
        print(f"self-graded {lab.spec.week}: {verdict(result)} in {took:.0f} s", flush=True)
        fields = {"week": lab.spec.week, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "infracourse_version": __version__, "graders_sha256": graders_digest(lab),
                  "environment": hw.as_dict(), "ceilings": None}
        for k in range(args.copies):
            path = scratch / "bundles" / f"{lab.spec.week}-ref{k}.zip"
            path.parent.mkdir(exist_ok=True)
            bundles.append(write_bundle(path, {**fields, "learner": f"reference{k}"}, files, result.as_dict(),
                                        executable=executable_files(scratch / "work" / lab.spec.week, files)))
    book_path = scratch / "gradebook.db"
    book_path.unlink(missing_ok=True)
    book = Gradebook.create(book_path, course)
    imported = book.import_bundles(bundles, course)
    if imported.rejected:
        print("bundles refused by the gradebook:", *map(str, imported.rejected), sep="\n  ")
        return 1
    began = time.perf_counter()
    load_before = os.getloadavg()[0]
    done = subprocess.run([sys.executable, "-m", "infracourse", "cohort", "regrade", "--workers", str(args.workers),
                           "--gradebook", str(book_path)], cwd=course.root, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        print(f"cohort regrade exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return 1
    disagreeing, ungraded = 0, 0
    for sub in sorted(book.latest_submissions(), key=lambda s: (s.week, s.learner)):
        own = book.results_of(sub.id, "self")
        verified = book.results_of(sub.id, "verified")
        mine, theirs = own[-1][1] if own else None, verified[-1][1] if verified else None
        found = compare(mine, theirs, same_machine=True) if mine and theirs else []  # as cohort regrade
        print(f"{sub.week} {sub.learner}: self {verdict(mine)}, verified {verdict(theirs)}"
              + ("" if found else ", agree"))
        if theirs is None:
            ungraded += 1
            print("  not regraded: see `cohort regrade`'s output above")
        for d in found:
            said = {c.id: c.message for c in mine.checks}.get(d["check"], "")
            print(f"  DISAGREE {d['check']}: self {d['self']}, verified {d['verified']}"
                  f"\n    self: {said[:300] or '-'}\n    verified: {d['message'] or '-'}")
        disagreeing += bool(found)
    print(f"{len(bundles)} bundle(s), {disagreeing} with a disagreement, {ungraded} not regraded; regrade with "
          f"{args.workers} worker(s) on {os.cpu_count()} CPU(s): {wall:.0f} s wall ({wall / len(bundles):.1f} s per "
          f"bundle), load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if disagreeing or ungraded else 0


if __name__ == "__main__":
    sys.exit(main())
