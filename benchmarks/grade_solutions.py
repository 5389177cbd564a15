"""Grade every built lab's reference solution on this machine and print the figures as Markdown.

    python benchmarks/grade_solutions.py [week07 week08 ...] [--out results.json]
    python benchmarks/grade_solutions.py week09 --with matmul.py=tests/fixtures/honest/week09/split_k_atomic.py
    python benchmarks/grade_solutions.py week10 --repeat 10      # consecutive grades: does it always complete?
    python benchmarks/grade_solutions.py week09 --timeline       # every check's start and learner call, timed:
                                                                 # where a slow grade spends its time
    python benchmarks/grade_solutions.py week17 --run "python bench.py"   # run the lab's own bench first and
                                                                 # put the figures block it prints in the report
    python benchmarks/grade_solutions.py week12 --refresh-report # as a learner on this machine would: grade,
                                                                 # write the figures it measured, grade again
    python benchmarks/grade_solutions.py week18 --check gpu-quant-serving   # a partial grade: that check and
                                                                 # the checks it requires

The raw data behind docs/gpu-results.md: each solution is copied to a scratch folder, its report stamped with
this machine's environment, and graded by the same runner as `infracourse grade`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from infracourse.course import Course
from infracourse.grading.report import stamp_environment
from infracourse.grading.runner import grade
from infracourse.hardware import cached_ceilings, detect


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("weeks", nargs="*")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--with", dest="overlays", action="append", default=[], metavar="FILE=SOURCE",
                        help="grade the solution with FILE replaced by SOURCE (an honest variant from tests/)")
    parser.add_argument("--repeat", type=int, default=1, help="grade each lab this many times in a row")
    parser.add_argument("--check", dest="checks", action="append", metavar="ID",
                        help="a partial grade: only this check and the checks it requires (repeatable)")
    parser.add_argument("--track", help="the track whose project weeks 22-24 grade (curriculum/tracks/)")
    parser.add_argument("--run", help="a command of the lab (e.g. 'python bench.py') run in the copied solution "
                        "before grading, as a learner on this machine would; a ```yaml figures block it prints "
                        "replaces the report's")
    parser.add_argument("--cold", action="store_true", help="compile every grade afresh (no compile cache kept "
                        "between a lab's grades, as an instructor's regrade does); by default a lab's grades share "
                        "one, as `infracourse grade` keeps one per week in the workspace")
    parser.add_argument("--timeline", action="store_true", help="print each check's start and result and each "
                        "learner call, with the seconds since the grade began and since the event before")
    parser.add_argument("--refresh-report", action="store_true",
                        help="when the report's figures (written on another machine) disagree with this machine's, "
                             "write this grade's measurements into the figures block and grade once more")
    args = parser.parse_args()
    course, hw = Course(track=args.track), detect()
    labs = [course.lab(w) for w in args.weeks] if args.weeks else course.labs()
    results = []
    print(f"device: {hw.device_name}; torch {hw.torch}; triton {hw.triton}; cuda {hw.cuda}; driver {hw.driver}")
    ceilings = cached_ceilings(hw) if hw.gpu_count else None
    if ceilings:
        print(f"ceilings: copy {ceilings.copy_gbps:.0f} GB/s; matmul " +
              ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in ceilings.matmul_tflops.items()))
    with tempfile.TemporaryDirectory() as tmp:
        for lab, attempt in [(lab, i) for lab in labs for i in range(args.repeat)]:
            folder = Path(tmp) / f"{lab.spec.week}-{attempt}"
            shutil.copytree(lab.solution, folder)
            for overlay in args.overlays:
                name, source = overlay.split("=", 1)
                shutil.copyfile(source, folder / name)
            if args.run:
                run_lab_command(args.run, folder, lab.spec.report, hw)
            if lab.spec.report:
                stamp_environment(folder / lab.spec.report, hw)
            cache = None if args.cold else Path(tmp) / "cache" / lab.spec.week
            on_event = Timeline() if args.timeline else None
            result = grade(course, lab, folder, hardware=hw, compile_cache=cache, on_event=on_event,
                           checks=args.checks)
            checks = {c.id: c for c in result.checks}
            if args.refresh_report and "report" in checks and checks["report"].status == "failed" \
                    and refresh_figures(course, lab, folder, result, hw, cache):
                print(f"\n(first grade of {result.week}: report failed: {checks['report'].message[:300]}; its figures "
                      f"block now holds this grade's measurements, graded again)")
                result = grade(course, lab, folder, hardware=hw, compile_cache=cache, on_event=on_event,
                               checks=args.checks)
            results.append(result.as_dict())
            label = " + ".join(args.overlays) or "reference"
            print(f"\n### {result.week} ({label}, grade {attempt + 1}/{args.repeat}): "
                  f"{'complete' if result.complete else 'NOT complete'}"
                  f"{' and verified on GPU' if result.verified_on_gpu else ''} ({result.seconds:.1f} s)")
            print("| check | status | s | figures | message |\n|---|---|---|---|---|")
            for c in result.checks:
                figures = "; ".join(f"{name} {measured}" + (f" (target {target})" if target else "")
                                    for name, f in c.figures.items() for measured, target in [f.shown()])
                message = c.message[:200 if c.status == 'passed' else 900].replace('|', '/')
                print(f"| {c.id} | {c.status} | {c.seconds:.1f} | {figures} | {message} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


class Timeline:
    """Prints each grading event with the seconds since the grade began and since the event before it."""

    def __init__(self):
        import time

        self.clock = time.perf_counter
        self.began = self.last = self.clock()

    def __call__(self, event: dict) -> None:
        now = self.clock()
        what = " ".join(str(event.get(k, "")) for k in ("check", "target", "inputs", "status")).strip()
        print(f"{now - self.began:8.2f} s  +{now - self.last:6.2f}  {event['event']:8s} {what}", flush=True)
        self.last = now


def run_lab_command(command: str, folder: Path, report, hw) -> None:
    import os
    import shlex
    import subprocess

    from infracourse.grading.report_check import FIGURES_BLOCK

    env = {**os.environ, "INFRACOURSE_DEVICE": "cuda" if hw.gpu_count else "cpu"}
    done = subprocess.run(shlex.split(command), cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    print(f"\n(`{command}` in the solution: exit {done.returncode}{'; ' + done.stderr[-400:] if done.returncode else ''})")
    printed = FIGURES_BLOCK.search(done.stdout)
    if printed:
        print(printed.group(0))
    if report and printed:
        path = folder / report
        text = path.read_text()
        path.write_text(FIGURES_BLOCK.sub(lambda m: printed.group(0), text, count=1))


def refresh_figures(course, lab, folder: Path, result, hw, cache) -> bool:
    """Rewrite the report's figures block with what this grade's checks recorded, as `infracourse measure` does
    (derived figures from their check graded again on the rewritten block); False when a measured figure is
    missing (its check failed)."""
    from infracourse.grading.measure import measure_report

    grades = iter([result])

    def grade_checks(ids):  # the grade already taken serves the measured figures; the derived ones grade again
        return next(grades, None) or grade(course, lab, folder, hardware=hw, compile_cache=cache, checks=ids)

    _, _, measured = measure_report(lab.spec, folder / lab.spec.report, grade_checks)
    blocked = {c.id for c in result.checks if c.status == "blocked"}  # owed to other hardware: not missing
    checks = {f.name: f.check for f in lab.spec.report.figures}
    return all(checks[name] in blocked for name in measured.left)


if __name__ == "__main__":
    main()
