"""Grade every built lab's reference solution on this machine and print the figures as Markdown.

    python benchmarks/grade_solutions.py [week07 week08 ...] [--out results.json]
    python benchmarks/grade_solutions.py week09 --with matmul.py=tests/fixtures/honest/week09/split_k_atomic.py
    python benchmarks/grade_solutions.py week10 --repeat 10      # consecutive grades: does it always complete?

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
    args = parser.parse_args()
    course, hw = Course(), detect()
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
            if lab.spec.report:
                stamp_environment(folder / lab.spec.report, hw)
            result = grade(course, lab, folder, hardware=hw)
            results.append(result.as_dict())
            label = " + ".join(args.overlays) or "reference"
            print(f"\n### {result.week} ({label}, grade {attempt + 1}/{args.repeat}): "
                  f"{'complete' if result.complete else 'NOT complete'}"
                  f"{' and verified on GPU' if result.verified_on_gpu else ''} ({result.seconds:.1f} s)")
            print("| check | status | figures | message |\n|---|---|---|---|")
            for c in result.checks:
                figures = "; ".join(f"{name} {measured}" + (f" (target {target})" if target else "")
                                    for name, f in c.figures.items() for measured, target in [f.shown()])
                print(f"| {c.id} | {c.status} | {figures} | {c.message[:200 if c.status == 'passed' else 900].replace('|', '/')} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
