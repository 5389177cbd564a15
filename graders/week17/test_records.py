"""The learner's raw per-request records (records.json, written by bench.py with kit.loadgen.write_records):
a real run of the load point, and every figure of the report recomputes from them."""
import pytest

from infracourse.grader import LabCheckFailed, read_figures
from infracourse.kit import batching
from infracourse.kit.loadgen import compute_metrics, read_records, serving_cost
from week17_judging import PERCENTILES, check_outputs

RECORDS = "records.json"
TOLERANCE = 0.01  # relative; the report rounds


def recomputed(m: dict) -> dict[str, float]:
    cost = serving_cost(m, batching.DEVICE_PRICE_PER_HOUR)
    total = m["completed"] + m["failed"]
    return {"ttft_p50_ms": m["ttft_ms"]["p50"], "ttft_p99_ms": m["ttft_ms"]["p99"], "tpot_p50_ms": m["tpot_ms"]["p50"],
            "e2el_p50_ms": m["e2el_ms"]["p50"], "e2el_p95_ms": m["e2el_ms"]["p95"], "e2el_p99_ms": m["e2el_ms"]["p99"],
            "requests_per_s": m["request_throughput"], "output_tokens_per_s": m["output_throughput"],
            "goodput_requests_per_s": m["request_goodput"], "failure_rate": m["failed"] / total if total else 0.0,
            "usd_per_1k_requests": cost["usd_per_1k_requests"],
            "usd_per_1m_output_tokens": cost["usd_per_1m_output_tokens"]}


@pytest.mark.check("raw-records")
def test_records_recompute_the_report(learner, judge_model, record):
    try:
        records, duration, _ = read_records(learner.path(RECORDS))
    except FileNotFoundError:
        raise LabCheckFailed(f"{RECORDS} is missing: run `python bench.py`, which serves your server, drives the "
                             "load point and writes every request's raw record there") from None
    except ValueError as exc:
        raise LabCheckFailed(f"{RECORDS} is not what kit.loadgen.write_records writes: {exc}") from None
    specs = batching.bench_specs(0)
    if len(records) != len(specs):
        raise LabCheckFailed(f"{RECORDS} holds {len(records)} records; the load point (bench_specs(0)) has "
                             f"{len(specs)} requests, one record each, in send order")
    for i, (spec, rec) in enumerate(zip(specs, records)):
        if rec.prompt_tokens != len(spec.prompt_ids):
            raise LabCheckFailed(f"{RECORDS}: record {i} has a {rec.prompt_tokens}-token prompt, request {i} of "
                                 f"bench_specs(0) has {len(spec.prompt_ids)}: records in send order, from the load "
                                 "point's own requests")
        times = [rec.send_time, *rec.chunk_times]
        if rec.success and (len(rec.chunk_times) != spec.max_tokens or times != sorted(times)):
            raise LabCheckFailed(f"{RECORDS}: record {i} is not a stream of {spec.max_tokens} chunks arriving in "
                                 "order after its send time")
    check_outputs(judge_model, specs, records, RECORDS)
    metrics = compute_metrics(records, duration, percentiles=PERCENTILES, goodput_slo_ms=batching.BENCH_SLO_MS)
    # goodput counts requests under a threshold: a busier grade's re-measure can fall 15x (178 vs 11 at load 9),
    # so the report's goodput is held to these records, whose latencies the report check holds to the judge's
    record("goodput (records)", metrics["request_goodput"], unit="requests/s")
    path = learner.path("report.md")
    reported = read_figures(path.read_text(encoding="utf-8"), path.name) if path.exists() else {}
    for name, value in recomputed(metrics).items():
        if name not in reported:
            raise LabCheckFailed(f"report.md's figures block lacks {name}, which your records give as {value:.4g}")
        if abs(reported[name] - value) > max(TOLERANCE * abs(value), 0.005):
            raise LabCheckFailed(
                f"report.md gives {name} = {reported[name]:.4g}, but your own records ({RECORDS}) give {value:.4g} "
                "(kit.loadgen.compute_metrics, percentiles by linear interpolation; TPOT per request = (E2EL - TTFT) "
                "/ (output tokens - 1), its first token excluded; throughputs over the run's wall time; costs at "
                f"${batching.DEVICE_PRICE_PER_HOUR:g}/h over the whole run, idle time included). Report what the "
                "records say")
