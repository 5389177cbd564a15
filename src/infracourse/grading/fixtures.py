"""Fixtures every grader can ask for. Loaded by the grading plugin.

- `learner`   the learner's files: `learner.module("vector_ops")`, `learner.path("report.md")`
- `hardware`  this machine (infracourse.hardware.Hardware)
- `device`    "cuda" when a GPU is present, else "cpu"
- `ceilings`  calibrated copy bandwidth and matmul rates of this GPU (measured once, cached)
- `record`    record(name, value, target=None, unit="") stores a measured figure with the check's result
- `seed`      a fresh random seed per attempt (printed with failures, so a learner can reproduce one)
"""
from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest


@functools.lru_cache(maxsize=1)
def current_hardware():
    from infracourse.hardware import detect

    return detect()


@dataclass
class Learner:
    root: Path

    def module(self, name: str):
        from infracourse.grading.plugin import import_learner_module

        return import_learner_module(name, self.root)

    def path(self, name: str) -> Path:
        return self.root / name


@pytest.fixture(scope="session")
def learner(request) -> Learner:
    session = getattr(request.config, "_infracourse", None)
    if session is None:
        raise pytest.UsageError("graders run through `infracourse grade`, which sets --infracourse-learner")
    return Learner(session.learner_dir)


@pytest.fixture(scope="session")
def hardware():
    return current_hardware()


@pytest.fixture(scope="session")
def device(hardware) -> str:
    return "cuda" if hardware.gpu_count else "cpu"


@pytest.fixture(scope="session")
def ceilings(hardware):
    from infracourse.hardware import calibrate

    return calibrate(hardware)


@pytest.fixture
def record(request):
    figures = request.node.__dict__.setdefault("_infracourse_figures", {})

    def _record(name: str, value: float, target: float | None = None, unit: str = "", **extra) -> None:
        figures[name] = {"value": value, "target": target, "unit": unit, **extra}

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
    from infracourse.grading.plugin import CHECK_KEY

    return request.config._infracourse.lab.check(request.node.stash[CHECK_KEY])
