"""The week's experiment: time spent waiting for data, with and without prefetch and a local cache, on slow
storage; and the record that lets someone else rebuild the same epoch.

    python experiment.py        # writes run.json, prints the report's figures block
"""
from infracourse.kit.datapipe import (BATCH_SIZE, COMPUTE_S, LAB, LATENCY_S, PREFETCH, ids_digest,  # noqa: F401
                                      slow_storage, write_dataset)

SEED = 0  # the pipeline's shuffle seed


def main() -> None:
    raise NotImplementedError(
        "TODO (experiment.py): write LAB into a temporary folder; with slow_storage(root, LATENCY_S) build the "
        "manifest; time one epoch (seconds inside next(), a COMPUTE_S sleep after each batch) without prefetch, "
        "with prefetch=PREFETCH, and a second epoch through a warm cache (count storage.server.take_reads()); "
        "write run.json (dataset_version, ids_sha256 of the no-prefetch epoch, seed, batch_size) and print the "
        "figures block")


if __name__ == "__main__":
    main()
