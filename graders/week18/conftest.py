"""Shared pieces of the week 18 graders: course objects built in the worker (the kit's draft/target pair, the
course's block pool) and the same objects here for the references; one intra-op thread on both sides."""
import pytest

from infracourse.kit import intra_op
from infracourse.kit.threads import intra_op_threads


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread(learner):
    # tiny models: one thread on both sides makes the timings steadier (see infracourse.kit.threads)
    learner.build(intra_op.set_intra_op_threads, 1)
    with intra_op_threads(1):
        yield
