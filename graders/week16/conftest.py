"""Shared pieces of the week 16 graders: the judge's own model of the allocator (what every operation must do,
so the learner's answers and reported state can be checked against it), and validated calls into the worker."""
import pytest

from infracourse.grader import require_own_implementation

# kit.paged_reference is mounted for the learner to read (the handout names it), and its contiguous_attention is
# the judge's answer for paged-attention: a paged_attention that gathered through the tables and returned it (a
# learner's copy proved it) passed without its own grouped-query attention or dtype handling
ATTENTION_REFERENCE = ("infracourse.kit.paged_reference.contiguous_attention",)


@pytest.fixture(scope="module")
def paged(learner):
    require_own_implementation(learner.root, "paged.py", ATTENTION_REFERENCE,
                               "write paged_attention's attention yourself (read kit.paged_reference, do not call it)")
    return learner.module("paged")
