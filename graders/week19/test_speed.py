"""Week 19 data wait, on the handout's storage setup (kit.datapipe: the LAB dataset behind storage that sleeps
LATENCY_S per read, a training step of COMPUTE_S per batch of BATCH_SIZE). Sleeps are not slowed by a loaded
CPU, so the margins below hold on a busy machine; every duration is the judge's clock (when the driver's
start and end lines arrived here), and every read is counted at the judge's storage server."""
import json

import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit import datapipe
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
def test_cache_avoids_second_reads(harness, lab_built, plan, record):
    """Epoch 0 through a cold cache folder; then, in one new process with the same folder, epoch 1 (warm: nothing
    read from storage) and epoch 2, after the judge rewrote one shard behind the cache (new samples; the same name,
    size and modification time) and the learner's build_manifest described the new data: the cache must hand out
    the new bytes and read nothing else again. A copy kept by name, in the folder or in the process, is stale."""
    root = harness.copy(LAB, "cached")  # this check's own copy: it rewrites a shard of it
    changed = LAB.shard_name(plan.seed % LAB.shards)  # whichever shard: a cache that keeps stale copies serves any
    cfg = dict(batch_size=BATCH_SIZE, seed=0, cache_dir=str(harness.scratch / "cache"))
    go, reads, new_ids = harness.scratch / "go", {}, []

    def between(line):  # the judge's side of the epochs task, run as each of its lines arrives
        if "epoch" in line:
            reads[line["epoch"]] = server.take_reads()
            if line["epoch"] == 1:
                new_ids[:] = datapipe.rewrite_shard(LAB, root / changed, plan.seed)
                go.write_text(json.dumps({"build": True}))
                go.replace(f"{go}-1")

    with harness.storage(root, LATENCY_S) as server, harness.storage(root) as listing:
        timed(harness, server, {"manifest": lab_built.manifest, "cfg": cfg, "compute_s": 0.0},
              "make_pipeline(cache_dir=...) epoch 0")
        first = server.take_reads()
        run = harness.run(server, LAB, {"task": "epochs", "manifest": lab_built.manifest, "cfg": cfg, "epochs": [1, 2],
                                        "manifest_socket": str(listing.socket_path), "go": str(go)},
                          "make_pipeline(cache_dir=...) epochs 1 and 2 in one new process", on_line=between)
    twice = sorted(n for n, c in first.items() if c > 1)
    if twice:
        raise LabCheckFailed(f"epoch 0 read {twice[:3]} from storage {first[twice[0]]} times each: a cold cache "
                             "reads each shard once and keeps it")
    lines = {line["epoch"]: line for line in run.results("epoch")}
    built = run.results("manifest")
    if set(lines) != {1, 2} or not built:
        raise LabCheckFailed("epochs 1 and 2 through the warm cache ended without their results")
    warm = lines[1]
    record("storage reads second epoch", sum(reads[1].values()))
    record("data wait second epoch cached", warm["wait_s"], unit="s")
    if "shard_changed" in warm or sorted(warm["ids"]) != sorted(LAB.reference_ids()):
        raise LabCheckFailed(
            "epoch 1 through the warm cache, the data unchanged, "
            + (f"raised ShardChanged({warm['shard_changed']!r})" if "shard_changed" in warm else
               "did not hand out every sample of the dataset exactly once")
            + ": a hit must give back exactly the bytes that were read from storage and kept")
    if reads[1]:
        raise LabCheckFailed(
            f"epoch 1, in a new process with the same cache_dir, read {sum(reads[1].values())} shards from the slow "
            f"storage again ({sorted(reads[1])[:3]}...), counted at the storage. Keep each shard read in a file "
            "under cache_dir (named by its sha256 from the manifest) and read that file when it exists")
    what = (f"epoch 2, after the judge rewrote {changed} in storage behind the warm cache (new samples; the same "
            "name, size and modification time) and your build_manifest described the new data")
    again = sorted(n for n in reads[2] if n != changed)
    if again:
        raise LabCheckFailed(f"{what}: it read {again[:3]} from storage again, though their bytes and manifest "
                             f"entries did not change: only {changed} is a miss")
    if built[0]["manifest"]["shards"].get(changed) == lab_built.manifest["shards"].get(changed):
        return  # a manifest that does not see a shard's bytes: manifest-hash fails it, in every grade
    epoch2 = lines[2]
    fix = ("A hit must be the bytes the manifest describes: name each cached file by the shard's sha256 from the "
           "manifest (a changed shard is then another file), or check a hit against the manifest and read the "
           "shard again when it does not match")
    if "shard_changed" in epoch2:
        raise LabCheckFailed(f"{what}: the epoch raised ShardChanged({epoch2['shard_changed']!r}): the cache gave "
                             f"its old copy of {changed}, whose bytes no longer match the new manifest. {fix}")
    stale = [i for i in epoch2["ids"] if i in set(LAB.layout()[changed])]
    if stale:
        raise LabCheckFailed(f"{what}: it handed out {len(stale)} samples of {changed}'s old content (e.g. sample "
                             f"{stale[0]}), which the storage no longer holds: the cache served a stale copy. {fix}")
    truth = [i for name, ids in LAB.layout().items() if name != changed for i in ids] + new_ids
    if sorted(epoch2["ids"]) != sorted(truth):
        missing = sorted(set(truth) - set(epoch2["ids"]))
        raise LabCheckFailed(f"{what}: it handed out {len(epoch2['ids'])} samples, {len(missing)} of the new data "
                             f"missing (e.g. {missing[:3]}); every sample of the new data exactly once: {fix}")
