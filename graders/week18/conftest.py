"""Shared pieces of the week 18 graders: course objects built in the worker (the kit's draft/target pair, the
course's block pool) and the same objects here for the references; one intra-op thread on both sides."""
import dataclasses

import pytest

from infracourse.grader import LabCheckFailed, in_worker
from infracourse.kit import gpt
from infracourse.kit import intra_op
from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.threads import intra_op_threads


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread(learner):
    # tiny models: one thread on both sides makes the timings steadier (see infracourse.kit.threads)
    learner.build(intra_op.set_intra_op_threads, 1)
    with intra_op_threads(1):
        yield


def remote_gpt(learner, cfg: GPTConfig, seed: int):
    """(the judge's kit GPT, the same model built in the worker)."""
    config = in_worker(GPTConfig, **dataclasses.asdict(cfg))
    return GPT(cfg, seed=seed).eval(), learner.build(gpt.GPT, config, seed=seed)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise LabCheckFailed(message)
