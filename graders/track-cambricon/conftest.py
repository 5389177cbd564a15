"""Shared pieces of the Cambricon track's graders: the configs the judge asks for, and reading the raw files
the learner's run wrote (untrusted data: parsed, type-checked, then recomputed with kit.porting)."""
from __future__ import annotations

import random

import pytest


@pytest.fixture
def rng(seed) -> random.Random:
    return random.Random(seed)
