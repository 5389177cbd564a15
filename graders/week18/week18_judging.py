"""The shared judging helpers of the week18 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
import dataclasses

from infracourse.grader import LabCheckFailed, in_worker, require_own_implementation
from infracourse.kit.gpt import GPT, GPTConfig


def remote_gpt(learner, cfg: GPTConfig, seed: int):
    """(the judge's kit GPT, the same model built in the worker)."""
    config = in_worker(GPTConfig, **dataclasses.asdict(cfg))
    return GPT(cfg, seed=seed).eval(), learner.build(GPT, config, seed=seed)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise LabCheckFailed(message)


# The course's int8 reference (kit.quant_eval, mounted for measure.py; kit.quant_serving, built in the worker) is
# the judge's side of every quantisation comparison: quant.py returning its answers would pass them all
QUANT_REFERENCES = ("infracourse.kit.quant_eval.quantize_per_channel", "infracourse.kit.quant_eval.reference_int8",
                    "infracourse.kit.quant_serving")


def learner_quant(learner):
    """The learner's quant.py, once the judge's reading finds it calls none of the course's int8 reference."""
    require_own_implementation(learner.root, "quant.py", QUANT_REFERENCES,
                               "write quantize and Int8Linear yourself (measure.py may use kit.quant_eval)")
    return learner.module("quant")
