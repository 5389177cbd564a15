"""A generated course and cohort: to preview the dashboard, for the engine's tests and for the benchmark.

`write_course` writes a complete, gradable course: every week a lab whose one learner file `answer.py`
must return 42, with two correctness checks, a report-sized handout, and on kernel weeks two GPU
performance checks (blocked on a CPU). `write_cohort` writes real submission bundles (through
`bundle.write_bundle`, exactly as `infracourse submit` does) for learners on a mix of devices; a learner's
skill sets how many checks pass and what fraction of their device's ceilings their kernels reach. The
same seed gives byte-identical bundles. `write_roster` writes the roster CSV of such a cohort; given the
secrets the gradebook issued (`Gradebook.roster()`), `write_cohort` signs each bundle as `submit` would.
"""
from __future__ import annotations

import csv
import random
from dataclasses import asdict, replace
from pathlib import Path

import yaml

from infracourse import __version__
from infracourse.cohort.bundle import graders_digest, write_bundle
from infracourse.course import Course
from infracourse.grading.results import CheckResult, Figure, GradeResult
from infracourse.hardware import Ceilings, Hardware

SOLUTION = "def answer():\n    return 42\n"
STARTER = 'def answer():\n    raise NotImplementedError("answer(): return 42")\n'
GRADERS = '''import pytest


@pytest.fixture(scope="module")
def answer(learner):
    return learner.module("answer").answer


@pytest.mark.check("answers")
def test_answers(answer):
    assert answer() == 42, f"answer() returned {answer()!r}, expected 42"


@pytest.mark.check("is-int")
def test_is_int(answer):
    assert type(answer()) is int, "answer() must return an int"
'''
PERFORMANCE = '''

@pytest.mark.check("bandwidth")
def test_bandwidth(answer, ceilings, record):
    record("bandwidth", ceilings.copy_gbps, unit="GB/s", fraction_of_ceiling=1.0)


@pytest.mark.check("throughput")
def test_throughput(answer, ceilings, record):
    best = max(ceilings.matmul_tflops.values())
    record("throughput", best, unit="TFLOP/s", fraction_of_ceiling=1.0)
'''
_CPU = Hardware(tier="cpu", gpu_count=0, gpu_name=None, gpu_memory_gib=None, sm_count=None, l2_bytes=None,
                cuda=None, driver=None, python="3.11.7", torch="2.13.0", triton="3.6.0",
                cpu="AMD EPYC 7B13", cpu_count=2)
DEVICES = [  # (hardware, ceilings): what a cohort's learners grade on
    (replace(_CPU, tier="cuda", gpu_count=1, gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=79.1, sm_count=132,
             l2_bytes=52428800, cuda="12.8", driver="570.124.06"),
     Ceilings("NVIDIA H100 80GB HBM3", 2950.0, {"float32": 51.0, "bfloat16": 720.0})),
    (replace(_CPU, tier="cuda", gpu_count=1, gpu_name="NVIDIA A100-SXM4-40GB", gpu_memory_gib=39.4, sm_count=108,
             l2_bytes=41943040, cuda="12.8", driver="570.124.06"),
     Ceilings("NVIDIA A100-SXM4-40GB", 1380.0, {"float32": 19.0, "bfloat16": 270.0})),
    (replace(_CPU, tier="cuda", gpu_count=1, gpu_name="NVIDIA GeForce RTX 4060 Laptop GPU", gpu_memory_gib=7.6,
             sm_count=24, l2_bytes=33554432, cuda="12.8", driver="572.16"),
     Ceilings("NVIDIA GeForce RTX 4060 Laptop GPU", 230.0, {"float32": 11.0, "bfloat16": 45.0})),
    (_CPU, None),
]


def write_course(root: Path, *, weeks: int = 24, kernel_weeks: tuple[int, ...] = tuple(range(7, 13))) -> Course:
    """A course of `weeks` built weeks (weeks in `kernel_weeks` have performance checks)."""
    entries = []
    for n in range(1, weeks + 1):
        week, lab = f"week{n:02d}", f"week{n:02d}-answer"
        kernel = n in kernel_weeks
        entries.append({"id": week, "phase": "Generated", "title": f"Answer {n}" + (" fast" if kernel else ""),
                        "objectives": ["return 42"], "hours": 1, "lab": lab})
        checks = [{"id": "answers", "title": "answer() is 42"}, {"id": "is-int", "title": "answer() is an int"}]
        if kernel:
            checks += [{"id": "bandwidth", "title": "copy bandwidth", "needs": "cuda", "kind": "performance",
                        "requires": ["answers"]},
                       {"id": "throughput", "title": "matmul rate", "needs": "cuda", "kind": "performance",
                        "requires": ["answers"]}]
        folder = root / "labs" / lab
        for side, text in (("starter", STARTER), ("solution", SOLUTION)):
            (folder / side).mkdir(parents=True, exist_ok=True)
            (folder / side / "answer.py").write_text(text)
        (folder / "README.md").write_text(f"# {week}\n\nMake `answer()` return 42.\n" + _prose(n, 60))
        (folder / "lab.yaml").write_text(yaml.safe_dump({"format_version": 1, "week": week, "title": f"Answer {n}",
                                                          "files": ["answer.py"], "hints": ["return 42"],
                                                          "checks": checks}, sort_keys=False))
        graders = root / "graders" / week
        graders.mkdir(parents=True, exist_ok=True)
        (graders / "test_answer.py").write_text(GRADERS + (PERFORMANCE if kernel else ""))
    (root / "curriculum").mkdir(parents=True, exist_ok=True)
    (root / "curriculum" / "syllabus.yaml").write_text(yaml.safe_dump(
        {"format_version": 1, "title": "generated course", "weeks": entries}, sort_keys=False))
    return Course(root)


def learner_id(i: int) -> str:
    return f"learner{i:03d}"


def write_roster(path: Path, learners: int) -> Path:
    """The roster CSV of `write_cohort`'s learners (id, name, email and the LMS ids)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "name", "email", "sis_user_id", "section", "idnumber"])
        for i in range(learners):
            writer.writerow([learner_id(i), f"Learner {i}", f"{learner_id(i)}@uni.example", f"S{100000 + i}",
                             f"section {i % 3 + 1}", f"ID{i:05d}"])
    return path


def write_cohort(course: Course, out: Path, *, learners: int = 500, seed: int = 0,
                 missing: float = 0.05, keys: dict[str, str] | None = None, start: int = 0) -> list[Path]:
    """Bundles for `learners` learners (numbered from `start`) x every built week (a fraction `missing` not
    handed in), each signed with its learner's secret key (hex) from `keys` when given."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    labs = [(lab, graders_digest(lab), (lab.path / "README.md").read_bytes()) for lab in course.labs()]
    paths = []
    for i in range(start, start + learners):
        learner = learner_id(i)
        hardware, ceilings = DEVICES[rng.randrange(len(DEVICES))]
        skill = rng.random()
        for number, (lab, digest, handout) in enumerate(labs, start=1):
            if rng.random() < missing:
                continue
            solved = rng.random() < 0.3 + 0.7 * skill
            result = result_for(lab, hardware, ceilings, solved=solved, share=min(1.1, skill * rng.uniform(0.6, 1.2)),
                                started_at=f"2026-{1 + number // 5:02d}-{1 + number % 5 * 5:02d}T{i % 24:02d}:00:00")
            fields = dict(learner=learner, week=lab.spec.week, created_at=result.started_at + "Z",
                          infracourse_version=__version__, graders_sha256=digest, environment=hardware.as_dict(),
                          ceilings=asdict(ceilings) if ceilings else None)
            files = {"answer.py": (SOLUTION if solved else STARTER).encode(), "README.md": handout,
                     "notes.md": _prose(i * 31 + number, 100).encode()}
            key = bytes.fromhex(keys[learner]) if keys else None
            paths.append(write_bundle(out / f"{learner}-{lab.spec.week}.zip", fields, files, result.as_dict(),
                                      key=key))
    return paths


def result_for(lab, hardware: Hardware, ceilings: Ceilings | None, *, solved: bool, share: float,
               started_at: str) -> GradeResult:
    """The grade such a learner's machine would report: correctness by `solved`, performance at `share`."""
    checks = []
    for check in lab.spec.checks:
        status, figures = ("passed" if solved else "failed"), {}
        if check.needs != "cpu" and not hardware.gpu_count:
            status = "blocked"
        elif check.kind == "performance" and solved and ceilings:
            ceiling = ceilings.copy_gbps if check.id == "bandwidth" else max(ceilings.matmul_tflops.values())
            unit = "GB/s" if check.id == "bandwidth" else "TFLOP/s"
            figures = {check.id: Figure(value=round(share * ceiling, 3), target=0.6 * ceiling, unit=unit,
                                        ceiling=ceiling, fraction_of_ceiling=round(share, 4))}
            status = "passed" if share >= 0.6 else "failed"
        checks.append(CheckResult(id=check.id, title=check.title, kind=check.kind, needs=check.needs,
                                  status=status, message="" if status == "passed" else "see the grader",
                                  figures=figures))
    return GradeResult(week=lab.spec.week, tier=hardware.tier, device=hardware.device_name,
                       fingerprint=hardware.fingerprint(), started_at=started_at, seconds=1.0, checks=checks,
                       grader_version=__version__)


def _prose(seed: int, words: int) -> str:
    """Deterministic filler the size of a learner's notes or a handout paragraph."""
    rng = random.Random(seed)
    vocabulary = ("bandwidth latency kernel warp block tile cache launch memory measure median repeat "
                  "synchronise device stream throughput roofline").split()
    lines = [" ".join(rng.choice(vocabulary) for _ in range(12)) for _ in range(words)]
    return "\n".join(lines) + "\n"
