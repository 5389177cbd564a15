"""Week 19: the learner's data pipeline, run by the judge in confined processes of its own (kit.datapipe's driver).

The dataset files live in a folder of the judge's that the sandbox does not show; the learner's code reaches
them only through the course's slow storage (kit.datapipe.StorageServer, a thread of this process on a Unix
socket in the scratch folder): its latency is slept here, and its count of reads is the judge's. Every task is
a fresh process, so a position restored in one was saved by another. What the processes print is evidence,
held against the dataset's seeded truth (DatasetSpec.reference_ids, payload) and the judge's clock.
"""
from __future__ import annotations

import random

import pytest

from infracourse.kit import datapipe
from infracourse.kit.datapipe import DatasetSpec
from week19_judging import WORLDS, Built, Harness, Plan, manifest_of


@pytest.fixture(scope="session")
def plan(seed) -> Plan:
    rng = random.Random(seed)
    spec = DatasetSpec(seed=1000 + seed % 10 ** 6, shards=rng.randint(14, 20))
    batch = rng.choice([7, 12, 13, 20])  # rarely divides a shard: a checkpoint falls inside one
    total = len(spec.reference_ids())
    worlds = [(2, 2)] + rng.sample([w for w in WORLDS if w != (2, 2)], 2)
    return Plan(seed=seed, spec=spec, pipe_seed=rng.randrange(10 ** 4), epoch=rng.randrange(3), batch_size=batch,
                worlds=tuple(worlds), stop_at=(rng.randint(3, total // batch - 3), rng.randint(1, 2)),
                corrupt=spec.shard_name(rng.randrange(spec.shards)))


@pytest.fixture(scope="session")
def harness(learner):
    h = Harness(learner.root)
    yield h
    h.close()


@pytest.fixture(scope="session")
def built(harness, plan) -> Built:
    """The grade's dataset (plan.spec) and the learner's manifest of it."""
    return manifest_of(harness, plan.spec, "main", f"build_manifest (seed {plan.seed})")


@pytest.fixture(scope="session")
def lab_built(harness) -> Built:
    """The handout's dataset (kit.datapipe.LAB) and the learner's manifest of it, for the timed checks."""
    return manifest_of(harness, datapipe.LAB, "lab", "build_manifest (the LAB dataset)")
