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


def pytest_itemcollected(item):
    """A test that calls labproof.assert_variant_fails proves one known-wrong variant of a lab: marked `variant`
    as it is collected, before `-m` selects, so `-m "not variant"` (README's middle tier) leaves these grades,
    two thirds of the suite's, to CI, and `-m variant` counts them."""
    function = getattr(item, "function", None)
    if function is not None and "assert_variant_fails" in function.__code__.co_names:
        item.add_marker("variant")


@pytest.hookimpl(trylast=True)  # after pytest's own reordering (by higher-scoped fixtures) and `-m`'s selection
def pytest_collection_modifyitems(items):
    """Under pytest-xdist the tests are handed out in the order of spread_waiting_tests (INFRACOURSE_TESTS_SPREAD=0:
    file order). Full runs alone on 2 cores, 2026-12-07: 22 min 47 s and 23 min 55 s spread against 28 min 5 s in
    file order, every test passed in each (docs/grading-times.md, seventh session); its first full run, beside
    other test runs, had failed the honest week-20 and week-21 servers."""
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("INFRACOURSE_TESTS_SPREAD", "1") != "0":
        items[:] = spread_waiting_tests(items)


# The test modules whose tests mostly wait: each grade serves the learner's server and loads it at fixed rates for
# fixed windows, kills and restarts it, or waits out a limit. On 2 cores with 3 workers one of these tests uses about
# a fifth of a core (cgroup CPU over the wall time of the 2026-12-07 full run: weeks 17, 19, 20, 21 and the
# platform track 0.17-0.32, test_resource_limits 0.12, test_launch_hang 0.11), the others two thirds (week 11 0.66,
# weeks 15, 16 and 18 0.65-0.71). In file order they came last, all together: the last 9 minutes of a 26-minute run
# kept the cores about 40 % busy.
WAITING_MODULES = {"test_week17.py", "test_week19.py", "test_week20.py", "test_week21.py", "test_track_platform.py",
                   "test_resource_limits.py", "test_launch_hang.py"}
# Seconds per test of the last full run (benchmarks/durations_log.py's first and third columns, tests of 1 s or more;
# `awk -F'\t' '$3 >= 1 {print $1 "\t" $3}' run.tsv`): out of date it packs less well, never wrongly.
DURATIONS = Path(__file__).with_name("durations.tsv")
UNLISTED_S = 0.1  # a test the file does not list (most take well under a second)


def spread_waiting_tests(items: list) -> list:
    """xdist (--dist loadgroup) hands the tests out in this order, each worker taking the next when it has two or
    fewer left. The tests of WAITING_MODULES, longest first, are spread among the others in proportion to their
    seconds (DURATIONS), so about one worker waits on a server while two keep the cores busy, and the run's end is
    the shortest tests, not a long wait. The others keep file order; a module with fixtures of module or class
    scope stays in one piece (torn apart, a worker would set its fixtures up again after each waiting test)."""
    seconds = _durations()

    def weight(item) -> float:
        return seconds.get(item.nodeid, UNLISTED_S)

    waiting = sorted((i for i in items if i.path.name in WAITING_MODULES), key=weight, reverse=True)  # stable
    stateful = {i.path for i in items if _module_state(i)}
    blocks: list[list] = []
    for item in items:
        if item.path.name in WAITING_MODULES:
            continue
        if blocks and blocks[-1][-1].path == item.path and item.path in stateful:
            blocks[-1].append(item)
        else:
            blocks.append([item])
    total_waiting = sum(map(weight, waiting)) or 1.0
    total_others = sum(weight(i) for block in blocks for i in block) or 1.0
    order, done_waiting, done_others, next_waiting = [], 0.0, 0.0, iter(waiting)
    pending = next(next_waiting, None)
    for block in blocks:
        while pending is not None and done_waiting / total_waiting <= done_others / total_others:
            order.append(pending)
            done_waiting += weight(pending)
            pending = next(next_waiting, None)
        order.extend(block)
        done_others += sum(map(weight, block))
    if pending is not None:
        order.append(pending)
    order.extend(next_waiting)
    assert len(order) == len(items)
    return order


def _durations() -> dict[str, float]:
    try:
        lines = DURATIONS.read_text().splitlines()
    except OSError:
        return {}
    return {nodeid: float(seconds) for nodeid, seconds in (line.split("\t") for line in lines if line)}


def _module_state(item) -> bool:
    """Whether `item` uses a fixture of module, class or package scope (kept between its module's tests)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True
    return any(defs and defs[-1].scope in ("module", "class", "package") for defs in info.name2fixturedefs.values())


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
