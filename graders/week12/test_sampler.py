"""The distributed sampler: each epoch the ranks' shards are disjoint and cover the data set; epochs differ."""
from __future__ import annotations

import pytest

from infracourse.grader import LabCheckFailed
from week12_judging import GLOBAL_BATCH, SAMPLES, STEPS

EPOCHS = STEPS // (SAMPLES // GLOBAL_BATCH)


def _epochs(world) -> list[list[list[int]]]:
    """Per rank, per epoch, the sample indices it consumed."""
    shards = []
    for rank, result in enumerate(world.results("main")):
        indices = result["out"].get("indices") if isinstance(result["out"], dict) else None
        if not isinstance(indices, list) or len(indices) != EPOCHS or not all(isinstance(e, list) for e in indices):
            raise LabCheckFailed(f"rank {rank}: 'indices' must be one list per epoch ({EPOCHS} epochs here: "
                                 f"{STEPS} steps of {SAMPLES // GLOBAL_BATCH} per epoch) of the sample indices it "
                                 f"consumed (the third item of each batch) ({world.describe('main')})")
        shards.append([[int(i) for i in epoch] for epoch in indices])
    return shards


@pytest.mark.check("shards-disjoint-complete")
def test_shards(launches):
    world = launches.two
    shards = _epochs(world)
    where = world.describe("main")
    for epoch in range(EPOCHS):
        seen = [set(rank[epoch]) for rank in shards]
        for rank, shard in enumerate(shards):
            if len(shard[epoch]) != len(seen[rank]):
                raise LabCheckFailed(f"epoch {epoch}: rank {rank} consumed some samples twice ({where})")
        if seen[0] & seen[1]:
            raise LabCheckFailed(f"epoch {epoch}: both ranks consumed samples {sorted(seen[0] & seen[1])[:8]} "
                                 f"({where}): each rank needs its own shard (DistributedSampler with num_replicas "
                                 "and rank)")
        if seen[0] | seen[1] != set(range(SAMPLES)):
            missing = sorted(set(range(SAMPLES)) - (seen[0] | seen[1]))
            raise LabCheckFailed(f"epoch {epoch}: samples {missing[:8]} were consumed by no rank ({where}): an "
                                 "epoch covers the whole data set across the ranks")
    for rank, shard in enumerate(shards):
        if any(shard[e] == shard[0] for e in range(1, EPOCHS)):
            raise LabCheckFailed(f"rank {rank} consumed the same samples in the same order in every epoch ({where}): "
                                 "call sampler.set_epoch(epoch) before each epoch, or every epoch repeats the first "
                                 "shuffle")
