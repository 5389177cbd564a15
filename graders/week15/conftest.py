"""Shared pieces of the week 15 graders: the kit's GPT built in the worker (the learner's code runs it there)
and the same model here for the references, and one validated call of the learner's generate."""
import pytest

from infracourse.grader import require_own_implementation
from infracourse.kit import intra_op
from infracourse.kit.threads import intra_op_threads

# kit.llama is mounted to load the course's checkpoint (checkpoint-tokens, phase-times, measure.py), and its KVCache
# and cached Llama.forward are the judge's reference for that check: the kit GPT has the same pieces, so a
# kv_cache.py running them (a learner's copy proved it) passed every cache check without writing a cache.
# llama_serving re-exports Llama
CACHE_REFERENCES = ("infracourse.kit.llama", "infracourse.kit.llama_serving")


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread(learner):
    # A tiny model: one thread on both sides makes the timings steadier (see infracourse.kit.threads).
    learner.build(intra_op.set_intra_op_threads, 1)
    with intra_op_threads(1):
        yield


@pytest.fixture(scope="module")
def kv(learner):
    require_own_implementation(learner.root, "kv_cache.py", CACHE_REFERENCES,
                               "write the cache and the cached forward yourself from the model's pieces (embed, "
                               "qkv_heads, attend, logits); measure.py may use kit.llama to load a checkpoint")
    return learner.module("kv_cache")
