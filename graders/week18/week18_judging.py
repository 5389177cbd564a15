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


# kit.speculative is mounted for measure.py's baseline, but its batched_greedy is the judge's truth for spec-greedy
# and its replay the judge's recount for spec-acceptance: a speculative.py returning their answers (a learner's
# copy proved it) passed both without drafting or verifying anything
SPECULATIVE_REFERENCES = ("infracourse.kit.speculative.batched_greedy", "infracourse.kit.speculative.replay")


def learner_speculative(learner):
    """The learner's speculative.py, once the judge's reading finds it calls none of the judge's greedy truth or
    recount."""
    require_own_implementation(learner.root, "speculative.py", SPECULATIVE_REFERENCES,
                               "draft, verify and count the accepted tokens yourself (measure.py may use "
                               "kit.speculative's batched_greedy as its baseline)")
    return learner.module("speculative")
