"""Week 19 data wait, on the handout's storage setup (kit.datapipe: the LAB dataset behind storage that sleeps
LATENCY_S per read, a training step of COMPUTE_S per batch of BATCH_SIZE). Sleeps are not slowed by a loaded
CPU, so the margins below hold on a busy machine; every duration is the judge's clock (when the driver's
start and end lines arrived here), and every read is counted at the judge's storage server."""
import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.datapipe import BATCH_SIZE, COMPUTE_S, LAB, LATENCY_S, PREFETCH

HIDDEN_FRACTION = 0.5  # of the epoch's read latency, prefetch must take off the course's synchronous loader


def timed(harness, server, task, what):
    run = harness.run(server, LAB, {"task": "timed", **task}, what)
    end = run.results("end")
    if not end:
        raise LabCheckFailed(f"{what} ended without a result")
    ids = end[0]["ids"]
    if sorted(ids) != sorted(LAB.reference_ids()):
        raise LabCheckFailed(f"{what} did not hand out every sample of the dataset exactly once")
    return run.at("end") - run.at("start"), end[0]["wait_s"]


@pytest.mark.check("prefetch-hides-latency")
def test_prefetch_hides_read_latency(harness, lab_built, record):
    cfg = dict(batch_size=BATCH_SIZE, seed=0)
    latency = LAB.shards * LATENCY_S  # one read per shard
    with harness.storage(lab_built.root, LATENCY_S) as server:
        reference, _ = timed(harness, server, {"reference": True, "names": sorted(lab_built.manifest["shards"]),
                                               "cfg": cfg, "compute_s": COMPUTE_S}, "the course's loader")
        _, wait_sync = timed(harness, server, {"manifest": lab_built.manifest, "cfg": cfg, "compute_s": COMPUTE_S},
                             "make_pipeline(prefetch=0)")
        wall, wait = timed(harness, server, {"manifest": lab_built.manifest, "cfg": dict(cfg, prefetch=PREFETCH),
                                             "compute_s": COMPUTE_S}, f"make_pipeline(prefetch={PREFETCH})")
    record("data wait without prefetch", wait_sync, unit="s")
    record("data wait with prefetch", wait, unit="s")
    record("hidden latency", reference - wall, target=HIDDEN_FRACTION * latency, unit="s")
    if reference - wall < HIDDEN_FRACTION * latency:
        raise LabCheckFailed(
            f"an epoch with prefetch={PREFETCH} took {wall:.2f} s on the grader's clock; the course's synchronous "
            f"loader took {reference:.2f} s. The {LAB.shards} reads sleep {latency:.2f} s in all, and a step "
            f"({COMPUTE_S * 1e3:.0f} ms per batch) leaves the CPU free: a prefetcher reading the next shards "
            f"during the steps must save at least {HIDDEN_FRACTION * latency:.2f} s, it saved "
            f"{reference - wall:.2f} s. Produce batches in a background thread into a bounded queue, so reads "
            "overlap the training steps")


@pytest.mark.check("cache-hits")
def test_cache_avoids_second_reads(harness, lab_built, record):
    """Epoch 0 through a cold cache folder, then epoch 1 in a fresh process with the same folder."""
    cache = str(harness.scratch / "cache")
    cfg = dict(batch_size=BATCH_SIZE, seed=0, cache_dir=cache)
    with harness.storage(lab_built.root, LATENCY_S) as server:
        timed(harness, server, {"manifest": lab_built.manifest, "cfg": cfg, "compute_s": 0.0},
              "make_pipeline(cache_dir=...) epoch 0")
        first = server.take_reads()
        _, wait = timed(harness, server, {"manifest": lab_built.manifest, "cfg": dict(cfg, epoch=1),
                                          "compute_s": 0.0}, "make_pipeline(cache_dir=..., epoch=1), a new process")
        second = server.take_reads()
    record("storage reads second epoch", sum(second.values()))
    record("data wait second epoch cached", wait, unit="s")
    twice = sorted(n for n, c in first.items() if c > 1)
    if twice:
        raise LabCheckFailed(f"epoch 0 read {twice[:3]} from storage {first[twice[0]]} times each: a cold cache "
                             "reads each shard once and keeps it")
    if second:
        raise LabCheckFailed(
            f"epoch 1, in a new process with the same cache_dir, read {sum(second.values())} shards from the slow "
            f"storage again ({sorted(second)[:3]}...), counted at the storage. Keep each shard read in a file "
            "under cache_dir (named by its sha256 from the manifest) and read that file when it exists")
