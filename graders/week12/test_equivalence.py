"""K optimiser steps of DDP with accumulation equal one process taking the global batch (kit reference)."""
from __future__ import annotations

import pytest

from infracourse.grader import LabCheckFailed
from week12_judging import GLOBAL_BATCH, STEPS, params_difference

def _check_world(world, reference) -> None:
    params, losses = reference
    results = world.results("main")
    where = world.describe("main")
    for rank, result in enumerate(results):
        out = result["out"]
        if not isinstance(out, dict):
            raise LabCheckFailed(f"train() returned {type(out).__name__} in rank {rank} ({where}); return the dict "
                                 "the handout describes")
        if out.get("global_batch") != GLOBAL_BATCH:
            raise LabCheckFailed(f"rank {rank} reports global_batch {out.get('global_batch')!r} ({where}); the "
                                 f"global batch is per_rank_batch x accumulation x world = {GLOBAL_BATCH}")
        problem = params_difference(out.get("params"), params)
        if problem:
            raise LabCheckFailed(
                f"after {STEPS} steps, rank {rank}'s weights are not those of one process training with the global "
                f"batch {GLOBAL_BATCH} ({where}): {problem}. Each micro-step's loss must be divided by the "
                "accumulation count (the mean over the global batch), the sampler must be a DistributedSampler "
                "with shuffle=True, the seed given and set_epoch(epoch) before each epoch, and the optimiser must "
                "step once per `accumulation` micro-steps, then zero the gradients")
    per_rank = [r["out"].get("losses") for r in results]
    if any(not isinstance(l, list) or len(l) != STEPS for l in per_rank):
        raise LabCheckFailed(f"'losses' must hold one float per optimiser step ({STEPS}) in every rank ({where})")
    for step, want in enumerate(losses):
        got = sum(float(l[step]) for l in per_rank) / len(per_rank)
        if abs(got - want) > 1e-4 * abs(want) + 1e-6:
            raise LabCheckFailed(
                f"step {step}: the ranks' losses average {got:.6g}, one process with the global batch has "
                f"{want:.6g} ({where}). Each rank's step loss is the sum of its micro-steps' losses divided by "
                "the accumulation count (its mean over its share of the batch)")


@pytest.mark.check("ddp-matches-single")
def test_matches_single_process(launches, reference, record):
    for world in (launches.one, launches.two):
        _check_world(world, reference)
    record("global batch", GLOBAL_BATCH)


@pytest.mark.check("bucket-size-invariant")
def test_bucket_size_does_not_change_results(launches):
    small = launches.two.results("buckets")
    buckets = len(small[0]["bucket_reductions"])
    if buckets < 2:
        raise LabCheckFailed(f"with bucket_cap_mb={launches.two.experiments['buckets']['bucket_cap_mb']} DDP "
                             f"reduced {buckets} bucket(s): pass bucket_cap_mb on to DistributedDataParallel")
    default = launches.two.results("main")
    for rank, (a, b) in enumerate(zip(small, default)):
        problem = params_difference(a["out"].get("params"), {k: v.float() for k, v in b["out"]["params"].items()})
        if problem:
            raise LabCheckFailed(f"rank {rank}: with {buckets} small buckets the weights differ from the run with "
                                 f"the default buckets ({launches.two.describe('buckets')}): {problem}. Bucketing "
                                 "only groups gradients for the all-reduce; it must not change what is summed")
