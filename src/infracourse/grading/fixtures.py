"""Fixtures every grader can ask for. Loaded by the grading plugin (which imports this module, never the
other way round).

- `learner`   the learner's files: `learner.module("vector_ops")` is a proxy whose calls run in the sandboxed
              worker (grading.remote); `learner.path("report.md")` a file of the snapshot, to read as data
- `hardware`  this machine (infracourse.hardware.Hardware)
- `device`    "cuda" when a GPU is present, else "cpu"
- `ceilings`  calibrated copy bandwidth and matmul rates of this GPU (measured once, cached)
- `record`    record(name, value, target=None, unit="", **extra) stores a measured figure (grading.results.Figure:
              extra names its typed keys or DETAIL_KEYS) with the check's result
- `seed`      a fresh random seed per attempt (printed with failures, so a learner can reproduce one)
"""
from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from infracourse.grading.protocol import BuildInWorker
from infracourse.grading.provenance import native_code_allowed
from infracourse.grading.remote import WorkerClient
from infracourse.grading.results import Figure, FigureError, figures_of
from infracourse.failures import LabCheckFailed
from infracourse.hardware import calibrate, detect

CHECK_KEY = pytest.StashKey[str]()  # the check id of a grader test, set at collection

# the engine's own code a worker may build objects from (the worker refuses any other target)
WORKER_BUILDERS = ("infracourse.kit.", "infracourse.grading.inputs")


def in_worker(target: Callable[..., Any], *args: Any, **kwargs: Any) -> BuildInWorker:
    """A course object to build inside the worker, `target(*args, **kwargs)` there: `target` is a function or class
    of infracourse.kit (or a grading input generator), named by the object itself, never by a string. Learner
    objects among the arguments go as themselves; specs among them are built first. Pass the result to
    `learner.build`'s worker, or where a spec is asked for (timed's inputs, a probe's arguments)."""
    module, name = getattr(target, "__module__", None) or "", getattr(target, "__qualname__", "")
    if not module.startswith(WORKER_BUILDERS) or not name or "<" in name:
        raise TypeError(f"in_worker builds course objects of infracourse.kit (or grading inputs), not {target!r}")
    return BuildInWorker(f"{module}:{name}", tuple(args), dict(kwargs))


@functools.lru_cache(maxsize=1)
def current_hardware():
    return detect()


@dataclass
class Learner:
    root: Path
    session: object  # the plugin's session, which owns the worker

    @property
    def worker(self):
        """The sandboxed process that runs the learner's code, started on first use."""
        if self.session.worker is None:
            session = self.session
            worker = WorkerClient(self.root, gpu=current_hardware().gpu_count > 0)
            worker.hung = session.hung
            worker.native_code = native_code_allowed(session.lab.files)
            worker.on_call = lambda name, inputs="", elements=0: session.emit(
                event="calling", check=session.current, target=name, inputs=inputs, elements=elements)
            session.worker = worker
        return self.session.worker

    def module(self, name: str):
        return self.worker.module(name)

    def build(self, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`target(*args, **kwargs)` built inside the worker (see `in_worker`): its value when plain data, else a
        proxy of the object."""
        return self.worker.build(in_worker(target, *args, **kwargs))

    def path(self, name: str) -> Path:
        """A file of the snapshot. Symbolic links are refused: the snapshot holds the learner's own files only."""
        path = self.root / name
        if path.is_symlink():
            raise LabCheckFailed(f"{name} is a symbolic link: submit the file itself")
        return path


@pytest.fixture(scope="session")
def learner(request) -> Learner:
    session = getattr(request.config, "_infracourse", None)
    if session is None:
        raise pytest.UsageError("graders run through `infracourse grade`, which sets --infracourse-learner")
    return Learner(session.learner_dir, session)


@pytest.fixture(scope="session")
def graded_checks(request) -> frozenset[str]:
    """The check ids this grade runs: every check of lab.yaml, or a partial grade's (grading.selection). A
    session fixture that drives learner code through several phases for different checks runs only the phases
    these checks read: a partial grade of one check then takes that phase's time, not the week's."""
    session = request.config._infracourse
    return frozenset(session.only or (c.id for c in session.lab.checks))


@pytest.fixture(scope="session")
def hardware():
    return current_hardware()


@pytest.fixture(scope="session")
def device(hardware) -> str:
    return "cuda" if hardware.gpu_count else "cpu"


@pytest.fixture(scope="session")
def ceilings(hardware):
    return calibrate(hardware)


@pytest.fixture
def record(request):
    figures = request.node.__dict__.setdefault("_infracourse_figures", {})

    def _record(name: str, value: float, target: float | None = None, unit: str = "", **extra) -> None:
        try:
            figures.update(figures_of({name: Figure.of(value, target=target, unit=unit, **extra)}))
        except FigureError as exc:  # a NaN measured, or a grader's typo: never a figure that reads as a pass
            raise FigureError(f"the figure {name!r} cannot be recorded: {exc}") from None

    return _record


@pytest.fixture(scope="session")
def seed() -> int:
    value = int(os.environ.get("INFRACOURSE_SEED") or random.SystemRandom().randrange(2**31))
    import torch

    torch.manual_seed(value)
    return value


@pytest.fixture
def lab_check(request):
    """This test's check from lab.yaml (its threshold, needs, ...)."""
    return request.config._infracourse.lab.check(request.node.stash[CHECK_KEY])
