"""Week 3 serving: the learner's latency / throughput / concurrency table must obey Little's law."""
import pytest

from infracourse.guard import LabCheckFailed

CONCURRENCIES, MAX_BATCH, PER_CLIENT = [1, 8], 2, 20
TOLERANCE = 0.15


@pytest.mark.check("littles-law")
def test_littles_law(schemes, experiment, workload, record):
    sequences = [s for batch in workload.batches for s in batch]
    rows = experiment.latency_table(schemes.pack, workload.remote_model, sequences, CONCURRENCIES, max_batch=MAX_BATCH,
                                    per_client=PER_CLIENT)
    if len(rows) != len(CONCURRENCIES):
        raise LabCheckFailed(f"latency_table returned {len(rows)} rows for concurrencies {CONCURRENCIES}")
    for concurrency, row in zip(CONCURRENCIES, rows):
        missing = {"concurrency", "throughput_rps", "mean_latency_s", "p99_latency_s"} - set(row)
        if missing:
            raise LabCheckFailed(f"a latency_table row lacks {sorted(missing)}")
        in_flight = row["throughput_rps"] * row["mean_latency_s"]
        record(f"throughput x latency at {concurrency}", in_flight, target=concurrency)
        if abs(in_flight - concurrency) > TOLERANCE * concurrency:
            raise LabCheckFailed(
                f"with {concurrency} closed-loop client(s) there are always {concurrency} request(s) in flight, so by "
                f"Little's law (in flight = throughput x latency) your {row['throughput_rps']:.1f} requests/s x "
                f"{row['mean_latency_s'] * 1e3:.2f} ms = {in_flight:.2f}. With {MAX_BATCH} served at a time the rest "
                "wait in the queue: latency runs from submitting a request to receiving its answer, and throughput "
                "is requests over the span in which the clients were sending.")
