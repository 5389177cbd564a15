"""Week 23: class isolation, the batch quota and fast refusals under overload, all from one phase: a batch flood
(25/s for 4 s, far above what 2 batch slots serve) with light interactive traffic beside it."""
import numpy as np
import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.loadgen import compute_metrics
from track_platform_judging import FLOOD_RATE, FLOOD_S, INTERACTIVE_N, INTERACTIVE_RATE, LIMITS, REFUSED

MIN_SAMPLES = 5
MIN_REFUSED_SHARE = 0.25


@pytest.mark.check("class-isolation")
def test_interactive_keeps_its_slo_under_a_batch_flood(mixed, lab_check, record):
    runs = mixed.get()["runs"]
    timed, start, end = runs["interactive"]
    failed = [t.record.error for t in timed if not t.record.success]
    if failed:
        raise LabCheckFailed(
            f"{len(failed)} of {INTERACTIVE_N} interactive requests failed while batch flooded the gateway; first: "
            f"{failed[0][:200]}. Interactive has its own queue: a full batch queue refuses batch, never interactive")
    m = compute_metrics([t.record for t in timed], end - start, percentiles=(50, 99))
    p99, bound = m["ttft_ms"]["p99"], lab_check.threshold
    record("interactive ttft p99", p99, target=bound, unit="ms")
    if p99 > bound:
        batch = [t.record for t in runs["batch"][0] if t.record.success]
        raise LabCheckFailed(
            f"interactive P99 time to first token was {p99:.0f} ms while batch requests arrived at {FLOOD_RATE:g}/s "
            f"(at most {bound:g} ms, the judge's clock; {len(batch)} batch requests were served meanwhile). One "
            "queue in arrival order puts every interactive request behind the batch backlog: keep a queue per "
            "class and give a freed slot to interactive first, with batch held to its quota")


@pytest.mark.check("batch-quota")
def test_batch_held_to_its_quota_and_not_starved(mixed, record):
    data = mixed.get()
    quota, alone = LIMITS["batch_slots"], data["alone"]
    if len(alone) < MIN_SAMPLES:
        raise LabCheckFailed(f"the judge read the course service's /debug/state only {len(alone)} time(s) while "
                             f"batch ran alone ({data['samples']} in all): it must answer while the gateway serves")
    most = max(alone)
    record("batch running max", most, target=quota, unit="sequences")
    if most > quota:
        raise LabCheckFailed(
            f"while only batch requests arrived ({FLOOD_RATE:g}/s), the course service ran up to {most} sequences at "
            f"once (its own /debug/state, sampled {len(alone)} times); batch's quota is {quota} of the service's "
            f"slots (INFRACOURSE_CLASSES batch_slots). Count the batch requests in flight at the service and hold "
            "the next one back while that count is at the quota")
    served = sum(t.record.success for t in data["runs"]["batch"][0])
    record("batch served", served, unit="requests")
    if served == 0:
        raise LabCheckFailed(
            f"no batch request succeeded during {FLOOD_S:g} s of batch arrivals while interactive load was light "
            f"({INTERACTIVE_RATE:g}/s): batch is starved. A quota caps batch; it must still get its slots")


@pytest.mark.check("overload-shed")
def test_excess_refused_fast(mixed, lab_check, record):
    timed, start, end = mixed.get()["runs"]["batch"]
    n = len(timed)
    refused = [t for t in timed if t.refused]
    other = [t.record.error for t in timed if not t.record.success and not t.refused]
    share = len(refused) / n
    record("batch refused share", share, unit="")
    if other:
        raise LabCheckFailed(
            f"{len(other)} of {n} batch requests failed other than by a refusal (HTTP 429 or 503); first: "
            f"{other[0][:200]}. Beyond its queue, refuse a request at once with 429; never let it wait out a timeout")
    if share < MIN_REFUSED_SHARE:
        raise LabCheckFailed(
            f"{n} batch requests arrived at {FLOOD_RATE:g}/s, several times what {LIMITS['batch_slots']} batch slots "
            f"serve, and only {len(refused)} were refused (at least {MIN_REFUSED_SHARE:.0%} expected): the rest "
            f"queued. Bound batch's queue (INFRACOURSE_CLASSES batch_queue = {LIMITS['batch_queue']}) and answer "
            "429 to the next arrival, so that a waiting request is one that will be served soon")
    waits = sorted(t.ended - t.record.send_time for t in refused)
    worst, bound = waits[-1], lab_check.threshold
    record("refusal p99", float(np.percentile(waits, 99)) * 1000, unit="ms")
    record("refusal max", worst * 1000, target=bound * 1000, unit="ms")
    if worst > bound:
        raise LabCheckFailed(
            f"refusals came slowly: the slowest {REFUSED[0]} took {worst:.2f} s (at most {bound:g} s, the judge's "
            "clock). Decide before the response starts: when the class's queue is full, answer 429 at once")
    slow = [t for t in timed if t.record.success and t.record.ttft > 10.0]
    if slow:
        raise LabCheckFailed(f"{len(slow)} accepted batch requests waited more than 10 s for a first token: the "
                             "queue is longer than what the slots drain soon; bound it")
