"""The shared judging helpers of the week18 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
import dataclasses

from infracourse.grader import LabCheckFailed, in_worker
from infracourse.kit.gpt import GPT, GPTConfig


def remote_gpt(learner, cfg: GPTConfig, seed: int):
    """(the judge's kit GPT, the same model built in the worker)."""
    config = in_worker(GPTConfig, **dataclasses.asdict(cfg))
    return GPT(cfg, seed=seed).eval(), learner.build(GPT, config, seed=seed)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise LabCheckFailed(message)
