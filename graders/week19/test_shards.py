"""Week 19 sharding: every (rank, dataloader worker) stream of several worlds, each in the learner's pipeline;
together the streams of one world must hand out every sample of the dataset exactly once (ids compared with
the seeded dataset's own, kit.datapipe.DatasetSpec.reference_ids)."""
from collections import Counter

import pytest

from infracourse.grader import LabCheckFailed
from week19_judging import flat


@pytest.mark.check("shards-disjoint")
def test_shards_disjoint_and_complete(harness, built, plan):
    streams = [dict(plan.cfg(), rank=r, world_size=w, worker=k, num_workers=n)
               for w, n in plan.worlds for r in range(w) for k in range(n)]
    with harness.storage(built.root) as server:
        run = harness.run(server, plan.spec, {"task": "ids", "manifest": built.manifest, "streams": streams},
                          "one epoch of every stream")
    got = {line["stream"]: line["ids"] for line in run.results("stream")}
    reference = plan.spec.reference_ids()
    for w, n in plan.worlds:
        members = [s for s, cfg in enumerate(streams) if (cfg["world_size"], cfg["num_workers"]) == (w, n)]
        what = (f"world_size={w}, num_workers={n} (dataset of {plan.spec.shards} shards, {len(reference)} samples, "
                f"batch_size={plan.batch_size}, seed {plan.seed})")
        owner: dict[int, list[str]] = {}
        for s in members:
            if s not in got:
                raise LabCheckFailed(f"{what}: the stream of rank {streams[s]['rank']}, worker "
                                     f"{streams[s]['worker']} ended without a result")
            for i in got[s]:
                owner.setdefault(i, []).append(f"(rank {streams[s]['rank']}, worker {streams[s]['worker']})")
        repeated = [i for i, who in owner.items() if len(who) > 1]
        if repeated:
            count = Counter(len(owner[i]) for i in repeated)
            raise LabCheckFailed(
                f"{what}: {len(repeated)} samples were handed out more than once, e.g. sample {repeated[0]} by "
                f"{', '.join(owner[repeated[0]])} ({dict(count)} by number of streams). Each of the "
                f"world_size * num_workers = {w * n} streams must take its own shards: number the streams "
                "rank * num_workers + worker and give stream s every (world_size * num_workers)-th shard from s")
        missing = set(reference) - set(owner)
        if missing:
            raise LabCheckFailed(f"{what}: {len(missing)} of {len(reference)} samples were handed out by no stream "
                                 f"(e.g. {sorted(missing)[:3]}): every shard belongs to exactly one stream, and "
                                 "the last partial batch is kept")
        unknown = set(owner) - set(reference)
        if unknown:
            raise LabCheckFailed(f"{what}: ids {sorted(unknown)[:3]} are not samples of this dataset")
    assert len(flat([got[s] for s in got])) == len(reference) * len(plan.worlds)
