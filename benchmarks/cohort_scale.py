"""Import and publish a generated cohort of 500 learners x 24 weeks (issue 6: under 30 s on 2 cores).

    python benchmarks/cohort_scale.py [--learners 500] [--cores 2] [--repeat 3] [--keep DIR]

First, untimed: a generated 24-week course (six kernel weeks) and one real submission bundle per learner x
week (5 % not handed in), written by the same `write_bundle` as `infracourse submit`, each with the
learner's file, the handout, a page of notes, a grade result and a device fingerprint. Then, timed, each
repeat into a fresh gradebook and site: `import_bundles` (read, validate and hash every bundle, record all
in one transaction) and `publish` (grid, 24 week pages, leaderboards, a page per learner). The process is
pinned to `--cores` CPUs. Prints a JSON summary; docs/cohort-benchmark.md holds measured figures.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from infracourse.cohort import synthetic
from infracourse.cohort.export import export
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.publish import publish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--learners", type=int, default=500)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="Write here (kept) instead of a temporary folder.")
    args = parser.parse_args()
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
    with tempfile.TemporaryDirectory(prefix="cohort-bench-") as tmp:
        root = args.keep or Path(tmp)
        course = synthetic.write_course(root / "course")
        start = time.perf_counter()
        bundles = synthetic.write_cohort(course, root / "bundles", learners=args.learners)
        generated = time.perf_counter() - start
        runs = [_run(course, bundles, root / f"run{i}") for i in range(args.repeat)]
        site = root / f"run{args.repeat - 1}" / "site"
        print(json.dumps({
            "learners": args.learners, "weeks": len(course.syllabus.weeks), "bundles": len(bundles),
            "bundle_mib": round(sum(p.stat().st_size for p in bundles) / 2**20, 1),
            "generate_s": round(generated, 1), "runs": runs,
            "median": {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0] if k.endswith("_s")},
            "site_files": sum(1 for p in site.rglob("*") if p.is_file()),
            "site_mib": round(sum(p.stat().st_size for p in site.rglob("*") if p.is_file()) / 2**20, 1),
            "gradebook_mib": round((site.parent / "gradebook.db").stat().st_size / 2**20, 1),
            "cores": sorted(os.sched_getaffinity(0)), "cpu": _cpu(), "python": platform.python_version(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }, indent=1))


def _run(course, bundles: list[Path], folder: Path) -> dict:
    folder.mkdir(parents=True)
    t0, c0 = time.perf_counter(), time.process_time()
    book = Gradebook.create(folder / "gradebook.db", course)
    report = book.import_bundles(bundles, course)
    t1 = time.perf_counter()
    publish(book, course, folder / "site")
    t2, c2 = time.perf_counter(), time.process_time()
    export(book, course, folder / "grades.csv")
    t3 = time.perf_counter()
    if not report.committed or report.rejected:
        sys.exit(f"the import failed: {report.rejected[:3]}")
    return {"import_s": round(t1 - t0, 2), "publish_s": round(t2 - t1, 2), "import_publish_s": round(t2 - t0, 2),
            "import_publish_cpu_s": round(c2 - c0, 2), "export_csv_s": round(t3 - t2, 2)}


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
