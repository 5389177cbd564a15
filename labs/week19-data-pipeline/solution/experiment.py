"""The week's experiment: time spent waiting for data, with and without prefetch and a local cache, on slow
storage; and the record that lets someone else rebuild the same epoch.

    python experiment.py        # writes run.json, prints the report's figures block

Storage setup (kit.datapipe): the lab's dataset (LAB: 12 shards, seed 19) behind a server that sleeps
LATENCY_S before each read; each training step is COMPUTE_S of sleep per batch of BATCH_SIZE.
"""
import json
import tempfile
import time
from pathlib import Path

from infracourse.kit.datapipe import (BATCH_SIZE, COMPUTE_S, LAB, LATENCY_S, PREFETCH, ids_digest, slow_storage,
                                      write_dataset)
from manifest import build_manifest
from pipeline import make_pipeline

SEED = 0  # the pipeline's shuffle seed


def timed_epoch(pipe) -> tuple[float, list[int]]:
    """(seconds spent in next() over one epoch, the ids in order), a training step after each batch."""
    wait, ids, batches = 0.0, [], iter(pipe)
    while True:
        start = time.perf_counter()
        batch = next(batches, None)
        wait += time.perf_counter() - start
        if batch is None:
            return wait, ids
        ids += batch[0].tolist()
        time.sleep(COMPUTE_S)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = write_dataset(LAB, Path(tmp) / "data")
        with slow_storage(root, LATENCY_S) as storage:
            manifest = build_manifest(storage)
            config = dict(batch_size=BATCH_SIZE, seed=SEED)
            wait_sync, ids = timed_epoch(make_pipeline(storage, manifest, **config))
            wait_prefetch, _ = timed_epoch(make_pipeline(storage, manifest, prefetch=PREFETCH, **config))
            cache = Path(tmp) / "cache"
            storage.server.take_reads()
            timed_epoch(make_pipeline(storage, manifest, cache_dir=cache, **config))  # fills the cache
            cold_reads = sum(storage.server.take_reads().values())
            wait_cached, _ = timed_epoch(make_pipeline(storage, manifest, cache_dir=cache, **config))
            warm_reads = sum(storage.server.take_reads().values())
    record = {"command": "python experiment.py", "dataset_seed": LAB.seed, "dataset_version": manifest["version"],
              "seed": SEED, "batch_size": BATCH_SIZE, "ids_sha256": ids_digest(ids)}
    Path("run.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"storage reads: first epoch {cold_reads}, second epoch {warm_reads}")
    print("```yaml figures")
    for name, value in [("read_latency_ms", LATENCY_S * 1e3), ("compute_ms_per_batch", COMPUTE_S * 1e3),
                        ("batch_size", BATCH_SIZE), ("prefetch_batches", PREFETCH), ("shards", LAB.shards),
                        ("data_wait_sync_s", wait_sync), ("data_wait_prefetch_s", wait_prefetch),
                        ("data_wait_cached_s", wait_cached), ("storage_reads_second_epoch", warm_reads)]:
        print(f"{name}: {value:.4g}")
    print("```")


if __name__ == "__main__":
    main()
