"""Shared pieces of the week 18 graders: course objects built in the worker (the kit's draft/target pair, the
course's block pool) and the same objects here for the references; one intra-op thread on both sides."""
import dataclasses

import pytest

from infracourse.grading.protocol import WorkerObject
from infracourse.guard import LabCheckFailed
from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.threads import intra_op_threads


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread(learner):
    # tiny models: one thread on both sides makes the timings steadier (see infracourse.kit.threads)
    learner.worker.build(WorkerObject("infracourse.kit.intra_op:set_intra_op_threads", (1,)))
    with intra_op_threads(1):
        yield


def kit(learner, target: str, *args, **kwargs):
    """A course object built (or a course function called) in the worker: 'module:name' under infracourse.kit."""
    return learner.worker.build(WorkerObject(f"infracourse.kit.{target}", args, kwargs))


def remote_gpt(learner, cfg: GPTConfig, seed: int):
    """(the judge's kit GPT, the same model built in the worker)."""
    config = WorkerObject("infracourse.kit.gpt:GPTConfig", (), dataclasses.asdict(cfg))
    return GPT(cfg, seed=seed).eval(), kit(learner, "gpt:GPT", config, seed=seed)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise LabCheckFailed(message)
