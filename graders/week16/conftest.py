"""Shared pieces of the week 16 graders: the judge's own model of the allocator (what every operation must do,
so the learner's answers and reported state can be checked against it), and validated calls into the worker."""
import pytest


@pytest.fixture(scope="module")
def paged(learner):
    return learner.module("paged")
