"""Week 14's launches, shared by its graders.

`world`: one torchrun launch of 2 ranks (gloo) runs kit.parallel_reference.grade_rank, which calls the learner's
parallel_mlp, two_stage_step and moe_layer with inputs made from the seed; the judge computes the dense
references itself (week14_references, beside the graders) and compares. `recovery`: the learner's elastic_train.train under
torchrun --max-restarts 1; the judge SIGKILLs rank 1 mid-run, plants a half-written checkpoint, and keeps its
own clock of the kill, the restarted world's first step, its catch-up and its end.
"""
from __future__ import annotations

import pytest

from week14_judging import Recovery, World, kill_and_restart


@pytest.fixture(scope="session")
def world(learner, seed, tmp_path_factory) -> World:
    return World(learner.root, seed, tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="session")
def recovery(learner, seed, tmp_path_factory) -> Recovery:
    # a rank lost to a runtime signal with no Python error (grading.torchrun.RanksRun.died_by_signal, gloo on
    # a loaded machine): the whole kill and restart runs once more, and the second run's verdict stands
    first = kill_and_restart(learner.root, seed, tmp_path_factory.mktemp("elastic"))
    if not first.run.died_by_signal():
        return first
    second = kill_and_restart(learner.root, seed, tmp_path_factory.mktemp("elastic-again"))
    second.run.attempts = 2
    return second
