"""Shared pieces of the week 15 graders: the kit's GPT built in the worker (the learner's code runs it there)
and the same model here for the references, and one validated call of the learner's generate."""
import pytest

from infracourse.kit import intra_op
from infracourse.kit.threads import intra_op_threads


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread(learner):
    # A tiny model: one thread on both sides makes the timings steadier (see infracourse.kit.threads).
    learner.build(intra_op.set_intra_op_threads, 1)
    with intra_op_threads(1):
        yield


@pytest.fixture(scope="module")
def kv(learner):
    return learner.module("kv_cache")
