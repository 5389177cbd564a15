"""The load point through the learner's server: every request succeeds and streams exactly what sequential
greedy generation (kit.generate, one request at a time) produces; the judge's metrics of that run are recorded
for the report."""
import pytest

from infracourse.kit import batching
from infracourse.kit.loadgen import serving_cost
from week17_judging import check_outputs, stand_in


@pytest.mark.check("greedy-outputs")
def test_greedy_outputs(served, judge_model, record):
    load = served.phases["load"].get()
    records, specs, m = load["records"], load["specs"], load["metrics"]
    failed = [(i, r.error) for i, r in enumerate(records) if not r.success]
    if failed:
        i, error = failed[0]
        raise served.failed(
            f"{len(failed)} of the load point's {len(records)} requests failed (32 in flight, at most "
            f"{served.cfg.max_num_seqs} running and {served.cfg.max_waiting} waiting: none may be refused at this "
            f"load); request {i} (prompt of {len(specs[i].prompt_ids)} tokens, max_tokens {specs[i].max_tokens}): {error[:400]}")
    check_outputs(judge_model, specs, records, f"the load point (seed {served.seed})")
    cost = serving_cost(m, batching.DEVICE_PRICE_PER_HOUR)
    figures = {"ttft p50": m["ttft_ms"]["p50"], "ttft p99": m["ttft_ms"]["p99"], "tpot p50": m["tpot_ms"]["p50"],
               "e2el p50": m["e2el_ms"]["p50"], "e2el p95": m["e2el_ms"]["p95"], "e2el p99": m["e2el_ms"]["p99"],
               "requests per s": m["request_throughput"], "output tokens per s": m["output_throughput"],
               "goodput": m["request_goodput"], "failure rate": m["failed"] / len(records),
               "peak rss": load["rss_mb"], "usd per 1k requests": cost["usd_per_1k_requests"],
               "usd per 1m output tokens": cost["usd_per_1m_output_tokens"]}
    labels = stand_in(served.cfg)  # on a CPU: every figure of the floor's stand-in says so
    for name, value in figures.items():
        record(name, value, **labels)
    if load["device_mb"] is not None:  # the server's GPU memory, as the driver reports it
        record("device memory", load["device_mb"], unit="MiB", source="device")
    # the report's latencies and rates come from the learner's own run: a busier grade moves these
    record("cpu contention (grader)", load["contention"])
