"""The model-vendor project's launches, shared by its graders.

`ep2`: a 2-rank launch of the first two experiments below (4 experts per rank).
`ep`: ONE torchrun launch of 4 ranks (gloo on CPU) runs kit.moe.grade_rank, which calls the learner's
ep_moe (moe.py) in five experiments with course expert modules that record which tokens they were given:
  uniform-capacity   the grade's seed, uniform routing, capacity factor 1.0, real experts
  uniform-count      the same routing, counting experts (each returns the one-hot row of its expert id, so the
                     combined output tells how many times each (token, expert) pair was added)
  uniform-free       the same routing without a capacity, counting experts (the all_to_all bytes)
  skewed-contiguous  the fixed skewed trace, no capacity, expert e on rank e // 2 (the load before)
  skewed-eplb        the same trace on the learner's eplb_placement (the load after)
The EPLB placement is asked of the learner's eplb_placement (in the worker) before the launch, from the judge's
own per-expert load, and checked (kit.moe.check_placement) before any rank uses it. The judge computes every
reference itself (kit.moe.dense_moe, routing_stats); what the ranks return is evidence held against it.
"""
from __future__ import annotations

import pytest

from track_model_vendor_judging import SMALL_WORLD, Launch, launch


@pytest.fixture(scope="session")
def ep(learner, seed, tmp_path_factory) -> Launch:
    return launch(learner, seed, tmp_path_factory.mktemp("ep"))


@pytest.fixture(scope="session")
def ep2(learner, seed, tmp_path_factory) -> Launch:
    """A second, smaller world: 2 ranks holding 4 experts each (a layer written for 4 ranks only fails here)."""
    return launch(learner, seed + 1, tmp_path_factory.mktemp("ep2"), world=2, names=SMALL_WORLD)
