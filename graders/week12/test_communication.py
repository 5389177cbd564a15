"""One gradient all-reduce per optimiser step, whatever the accumulation (no_sync on the other micro-steps).

DDP's reducer calls the process group from C++, so the course counts its reductions with a DDP comm hook that
run_experiments' probe registers on every DistributedDataParallel model (the default reduction, counted per
bucket). The count is evidence; the weights are checked against the reference by ddp-matches-single."""
from __future__ import annotations

import pytest

from infracourse.grader import LabCheckFailed
from week12_judging import STEPS


@pytest.mark.check("one-allreduce-per-step")
def test_one_allreduce_per_optimiser_step(launches, record):
    for world in (launches.one, launches.two):
        accumulation = world.experiments["main"]["accumulation"]
        for rank, result in enumerate(world.results("main")):
            reductions = result["bucket_reductions"].get(0, 0)
            where = world.describe("main")
            if reductions == 0:
                extra = (f" (it called torch.distributed.all_reduce {result['python_all_reduce']} times itself)"
                         if result["python_all_reduce"] else "")
                raise LabCheckFailed(f"rank {rank}: no DistributedDataParallel model reduced gradients{extra} "
                                     f"({where}). Wrap the kit's model in DistributedDataParallel and let it "
                                     "all-reduce (do not register a comm hook of your own: the course's counts)")
            if reductions != STEPS:
                raise LabCheckFailed(
                    f"rank {rank}: DDP all-reduced the gradients {reductions} times in {STEPS} optimiser steps of "
                    f"{accumulation} micro-steps ({where}); expected {STEPS}, once per optimiser step. Run the first "
                    "accumulation - 1 forward+backward passes inside `with model.no_sync():` and only the last "
                    "outside it: the gradients accumulate locally and are summed across ranks once")
        record(f"all-reduces per step, world {world.size}", reductions / STEPS)
