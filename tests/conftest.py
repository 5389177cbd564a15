"""Shared helpers for the engine's tests and for every lab's proof of its grader."""
from __future__ import annotations

import os

# The suite's own processes (xdist workers, the warm judge interpreter) run one OpenMP thread, as every process of a
# grade does (ONE_THREAD in infracourse.launch); set before torch loads OpenMP
if "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

if not torch.cuda.is_available():
    # Triton builds triton.language (tl.max, tl.sum, ...) when it is first imported: the interpreter must be on
    # by then, or in-process kernels of a later test fail with "Cannot call @triton.jit'd outside of ...".
    os.environ.setdefault("TRITON_INTERPRET", "1")

import shutil
import tempfile
from pathlib import Path

import pytest

from infracourse.cohort.release import is_honest_solution
from infracourse.course import Course
from infracourse.grading import judges
from infracourse.grading.report import stamp_environment
from infracourse.grading.runner import grade
from infracourse.hardware import detect

REPO = Path(__file__).resolve().parent.parent
LEARNER_RELEASE = (REPO / "RELEASE.json").is_file()  # `infracourse release` wrote this copy: no solutions in it
NO_SOLUTIONS = "needs the reference solutions, which a learner release does not ship (see RELEASE.json)"


def pytest_configure(config):
    config.addinivalue_line("markers", f"solutions: {NO_SOLUTIONS}; skipped there")
    config.addinivalue_line("markers", "check(id): a course check (grading.project's generic tests are imported here)")
    config.addinivalue_line("markers", "variant: a known-wrong variant of a lab's solution fails the check meant to "
                                       "catch it (set from the test's call of labproof.assert_variant_fails)")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under pytest-xdist (README's `-n`) each worker, and every process it starts, gets its own temp folder:
        # what a test asserts about shared scratch (a regrade's sweep leaves the scratch root empty) must not see
        # the files of a grade another worker is running at the same time.
        os.environ["TMPDIR"] = tempfile.mkdtemp(prefix=f"infracourse-tests-{os.environ['PYTEST_XDIST_WORKER']}-")
        tempfile.tempdir = None  # re-read TMPDIR
    # Hundreds of grades in one process: each judge forks from one warm interpreter rather than importing torch
    # afresh (grading.judges; the CLI's tests still start fresh judges, in their own processes).
    judges.keep_warm()


def pytest_collection_modifyitems(items):
    """A test that calls labproof.assert_variant_fails proves one known-wrong variant of a lab: marked
    `variant`, so `-m "not variant"` (README's quick tier) leaves these grades, two thirds of the suite's, to CI."""
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and "assert_variant_fails" in function.__code__.co_names:
            item.add_marker("variant")


def pytest_unconfigure(config):
    judges.stop_warm()
    if os.environ.get("PYTEST_XDIST_WORKER") and "infracourse-tests-" in os.environ.get("TMPDIR", ""):
        shutil.rmtree(os.environ["TMPDIR"], ignore_errors=True)


def pytest_runtest_setup(item):
    if LEARNER_RELEASE and item.get_closest_marker("solutions"):
        pytest.skip(NO_SOLUTIONS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In a learner release, a test stopped by a missing labs/*/solution file is skipped too, saying why
    (tests that miss the solutions some other way carry @pytest.mark.solutions)."""
    report = (yield).get_result()
    if LEARNER_RELEASE and call.excinfo and _missing_solution(call.excinfo.value):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1], f"Skipped: {NO_SOLUTIONS}")


def _missing_solution(error: BaseException) -> bool:
    if not (isinstance(error, FileNotFoundError) and error.filename):
        return False
    path = Path(error.filename).resolve()
    if path.is_relative_to(REPO) and is_honest_solution(path.relative_to(REPO).as_posix()):
        return True  # an honest solution of tests/fixtures, which a release leaves out like the reference
    return path.is_relative_to(REPO / "labs") and path.relative_to(REPO / "labs").parts[1:2] == ("solution",)


@pytest.fixture(scope="session")
def course() -> Course:
    return Course(REPO)


@pytest.fixture(scope="session")
def machine():
    return detect()


@pytest.fixture
def grade_lab(course, machine, tmp_path):
    """grade_lab(week, source="solution"|"starter", edits={file: new_text (or bytes) or fn(old_text) -> new_text}, track=None,
    checks=None).

    Copies the lab's starter or solution into a fresh folder, stamps report.md with this machine's
    environment (a report is machine-specific), applies the edits, grades, and returns
    (GradeResult, {check_id: CheckResult}). A project week (22-24) grades the project of `track`; `checks`
    grades only those checks and what they require (a partial grade, as `infracourse grade --check`).
    """
    def _grade(week, source="solution", edits=None, stamp=True, track=None, checks=None):
        lab = course.lab(week, track=track)
        folder = tmp_path / f"{lab.spec.week}-{source}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(getattr(lab, source), folder)
        if stamp and lab.spec.report and (folder / lab.spec.report).exists():
            stamp_environment(folder / lab.spec.report, machine)
        for name, change in (edits or {}).items():
            path = folder / name
            new = change(path.read_text()) if callable(change) else change
            path.write_bytes(new) if isinstance(new, bytes) else path.write_text(new)  # bytes: a plot, say
        result = grade(course, lab, folder, hardware=machine, checks=checks)
        return result, {c.id: c for c in result.checks}

    return _grade


def replace_once(old: str, new: str):
    """An edit for grade_lab that fails loudly if the solution no longer contains `old`."""
    def _edit(text: str) -> str:
        assert text.count(old) == 1, f"expected exactly one {old!r} in the solution"
        return text.replace(old, new)

    return _edit
