"""Week 19 versions: the manifest's hashes see a shard's content, and the version recorded by the learner's
experiment (run.json) rebuilds the same samples, in the same order, from a clean copy of the data."""
import json

import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit import datapipe
from infracourse.kit.datapipe import PREFETCH
from week19_judging import check_manifest


@pytest.mark.check("manifest-hash")
def test_changed_shard_is_detected(harness, built, plan):
    """A copy of the dataset whose shard plan.corrupt has one byte changed in place: same size, same mtime."""
    root = harness.copy(plan.spec, "changed")
    offset = datapipe.corrupt_shard(root / plan.corrupt, plan.seed)
    what = f"{plan.corrupt} with its byte {offset} changed (same size and modification time; seed {plan.seed})"
    with harness.storage(root) as server:
        run = harness.run(server, plan.spec, {"task": "manifest", "old": built.manifest},
                          "build_manifest and changed_shards on a changed dataset")
        new = check_manifest(run.results("manifest")[0]["manifest"], plan.spec, root, "build_manifest")
        differ = sorted(n for n in new["shards"] if new["shards"][n] != built.manifest["shards"][n])
        if len(differ) > 1:
            raise LabCheckFailed(
                f"{what}: the entries of {len(differ) - (plan.corrupt in differ)} unchanged shards differ between "
                f"this copy of the dataset and the first one (e.g. {[n for n in differ if n != plan.corrupt][:2]}): "
                "an entry must depend only on the shard's bytes, never on its folder or when it was written")
        if differ != [plan.corrupt]:
            raise LabCheckFailed(
                f"{what}: the manifest entries that changed are {differ or 'none'}; expected exactly "
                f"[{plan.corrupt}]. An entry's hash must be computed from the shard's bytes: its name and size "
                "are the same as before")
        if new["version"] == built.manifest["version"]:
            raise LabCheckFailed(f"{what}: the dataset version stayed {new['version'][:16]}...: it must be a hash "
                                 "of the whole manifest, so any changed shard changes it")
        changed = run.results("changed")[0]["changed"]
        if changed != [plan.corrupt]:
            raise LabCheckFailed(f"{what}: changed_shards(storage, old_manifest) returned {changed}; expected "
                                 f"[{plan.corrupt!r}]")
        streams = [plan.cfg(), plan.cfg(prefetch=PREFETCH)]
        run = harness.run(server, plan.spec, {"task": "ids", "manifest": built.manifest, "streams": streams,
                                                   "payload_every": 0}, "an epoch over the changed shard", timeout_s=30)
    for line in run.results("stream"):
        if line.get("shard_changed") != plan.corrupt:
            raise LabCheckFailed(
                f"{what}: an epoch of make_pipeline({streams[line['stream']]}) with the old manifest "
                + (f"raised ShardChanged({line['shard_changed']!r})" if "shard_changed" in line else
                   "handed out the changed bytes without complaint")
                + f"; it must raise kit.datapipe.ShardChanged({plan.corrupt!r}) when the shard's bytes do not "
                "match their hash (and a prefetcher must hand that exception to the loop)")


@pytest.mark.check("version-reproducible")
def test_recorded_version_rebuilds_the_same_epoch(harness, learner):
    """Two clean copies of the handout's dataset, written in opposite orders in other folders, each read by
    fresh processes: the manifest version and the epoch's order must equal each other and run.json's."""
    path = learner.path("run.json")
    if not path.exists():
        raise LabCheckFailed("run.json is missing: run `python experiment.py`, which records the dataset version "
                             "and the order of the epoch it read, and submit the file")
    try:
        record = json.loads(path.read_text())
        version, digest = str(record["dataset_version"]), str(record["ids_sha256"])
        cfg = {"batch_size": int(record["batch_size"]), "seed": int(record["seed"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise LabCheckFailed(f"run.json must hold dataset_version, ids_sha256, batch_size and seed ({exc})") from None
    seen = []
    for name, reverse in (("clean-a", False), ("clean-b", True)):
        root = harness.copy(datapipe.LAB, name, reverse=reverse)
        with harness.storage(root) as server:
            run = harness.run(server, datapipe.LAB, {"task": "manifest"}, "build_manifest on a clean copy")
            manifest = check_manifest(run.results("manifest")[0]["manifest"], datapipe.LAB, root, "build_manifest")
            run = harness.run(server, datapipe.LAB, {"task": "ids", "manifest": manifest, "streams": [cfg]},
                              f"an epoch of make_pipeline({cfg}) on a clean copy")
        seen.append((manifest["version"], datapipe.ids_digest(run.results("stream")[0]["ids"])))
    (a_version, a_ids), (b_version, b_ids) = seen
    if a_version != b_version:
        raise LabCheckFailed("two copies of the same dataset in different folders, written in opposite orders, got "
                             f"versions {a_version[:16]}... and {b_version[:16]}...: a version must depend on the "
                             "shards' names and contents only (no paths, times or listing order)")
    if a_version != version:
        raise LabCheckFailed(f"run.json records dataset version {version[:16]}...; a clean copy of the LAB dataset "
                             f"gives {a_version[:16]}... Run experiment.py again after changing manifest.py")
    if a_ids != b_ids:
        raise LabCheckFailed(f"make_pipeline({cfg}) read the two clean copies in different orders: the order "
                             "must follow from (seed, epoch) and the manifest, not from the folder or the process")
    if a_ids != digest:
        raise LabCheckFailed(f"run.json records the epoch's order as ids_sha256 {digest[:16]}...; the same "
                             f"pipeline ({cfg}) on a clean copy gives {a_ids[:16]}... (kit.datapipe.ids_digest of "
                             "the epoch's ids). Run experiment.py again after changing the pipeline")
