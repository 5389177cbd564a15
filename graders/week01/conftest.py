"""Shared fixtures of the week 1 graders: the learner's two modules."""
import pytest


@pytest.fixture(scope="session")
def harness(learner):
    return learner.module("harness")


@pytest.fixture(scope="session")
def experiments(learner):
    return learner.module("benchmark")
