"""Import a generated cohort of 5,000 learners x 24 weeks (issue 13: under 2 minutes and 1 GB on 2 cores).

    python benchmarks/cohort_import_scale.py [--learners 5000] [--cores 2] [--jobs 2] [--keep DIR]

Untimed setup (kept in --keep DIR and reused by a later run): the generated 24-week course, a roster of the
learners imported into a template gradebook (each issued a secret), and one real submission bundle per
learner x week (5 % not handed in), signed with its learner's secret by the same `write_bundle` as
`infracourse submit`. Then, timed, in a fresh Python process pinned to --cores CPUs: a copy of the template
gradebook imports the whole folder exactly as `infracourse cohort import DIR` does (the folder listed by the
tool, every bundle read, size/zip/manifest/hash/signature/claims checked, all recorded in one SQLite
transaction, --jobs checking processes). Peak memory is `resource.getrusage` ru_maxrss of the importing
process (with --jobs > 1 the checking processes, forkserver children holding one bundle each, are not in
it: measure memory with --jobs 1). Prints a JSON summary; the figures are in docs/cohort-benchmark.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from infracourse.cohort import synthetic
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.roster import read_roster

CHILD = """
import json, resource, sys, time
from pathlib import Path
from infracourse.cohort.cli import bundle_paths
from infracourse.cohort.gradebook import Gradebook
from infracourse.course import Course
book, course, folder, jobs = sys.argv[1:]
t0 = time.perf_counter()
count, paths = bundle_paths([folder])
report = Gradebook(Path(book)).import_bundles(paths, Course(Path(course)), require_roster=True, jobs=int(jobs))
seconds = time.perf_counter() - t0
print(json.dumps({"import_s": round(seconds, 1), "bundles": count, "imported": len(report.imported),
                  "rejected": [str(e) for e in report.rejected[:3]], "committed": report.committed,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                  "peak_rss_checker_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024,
                  "cpu_s": round(sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime
                                     for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)), 1)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--learners", type=int, default=5000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--keep", type=Path, required=True, help="Folder for the generated cohort (reused).")
    args = parser.parse_args()
    root = args.keep
    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    if not (root / "ready").exists():
        start = time.perf_counter()
        course = synthetic.write_course(root / "course")
        book = Gradebook.create(root / "template.db", course)
        book.import_roster(read_roster(synthetic.write_roster(root / "roster.csv", args.learners)))
        keys = {learner.id: key for learner, key in book.roster()}
        step = 250
        with ProcessPoolExecutor(len(cores)) as pool:
            list(pool.map(_generate, [(root, i, min(step, args.learners - i), keys)
                                      for i in range(0, args.learners, step)]))
        (root / "ready").write_text(f"{time.perf_counter() - start:.0f} s to generate\n")
    bundles = root / "bundles"
    book = root / "gradebook.db"
    shutil.copy(root / "template.db", book)
    os.sched_setaffinity(0, cores)  # the child inherits it
    load = os.getloadavg()[0]
    out = subprocess.run([sys.executable, "-c", CHILD, str(book), str(root / "course"), str(bundles), str(args.jobs)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    print(json.dumps(result | {
        "learners": args.learners, "bundle_mib": round(sum(p.stat().st_size for p in bundles.iterdir()) / 2**20),
        "gradebook_mib": round(book.stat().st_size / 2**20), "jobs": args.jobs, "cores": cores, "cpu": _cpu(),
        "python": platform.python_version(), "load_average_1m_before": round(load, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2)}, indent=1))


def _generate(job) -> None:
    root, start, count, keys = job
    course = synthetic.Course(root / "course")
    synthetic.write_cohort(course, root / "bundles", learners=count, start=start, seed=start, keys=keys)


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
