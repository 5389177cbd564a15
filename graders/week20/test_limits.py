"""Limits under load: per-client rate limiting (429 + Retry-After) that protects the others' latency, a deadline
per request, and a bounded queue that refuses at once."""
import math

import pytest

from infracourse.grader import LabCheckFailed, cpu_contention
from infracourse.kit import service_kit as sk

P99_FACTOR, P99_SLACK_S = 3.0, 0.5   # loaded P99 <= max(3 x baseline, baseline + 0.5 s): a loaded CI machine's margin
DEADLINE_EPS_S = 0.6                 # answered by deadline + 0.6 s
REFUSAL_S = 1.0                      # a refusal within 1 s of its send
OVERLAP_SLACK = 2                    # requests answered while the judge had not yet read an earlier answer


def _no_errors(answers, what):
    lost = [a for a in answers if a is None or not a.status]
    if lost:
        first = next((a.error for a in lost if a is not None), "no answer")
        raise LabCheckFailed(f"{what}: {len(lost)} request(s) got no HTTP answer ({first})")


@pytest.mark.check("rate-limit")
def test_rate_limit(served, record):
    with served.teaching():
        r = served.phases["rate"].get()
        cfg = served.cfg
        base, steady, greedy = r["baseline"], r["steady"], r["greedy"]
        _no_errors(base + steady + greedy, "the rate phase")
        what = (f"rate {cfg.rate:g}/s, burst {cfg.burst} per client; client 'steady' sends {sk.STEADY_HZ:g}/s while "
                f"{sk.GREEDY_CLIENTS} others send {sk.GREEDY_HZ:g}/s each for {sk.GREEDY_S:g} s")
        refused = [a for a in base + steady if a.status != 200]
        if refused:
            a = refused[0]
            raise LabCheckFailed(f"{what}: the under-limit client 'steady' got HTTP {a.status} ({a.body[:150]!r}) for "
                                 f"{len(refused)} of its {len(base) + len(steady)} requests; a client under its rate is "
                                 "never refused. Keep one bucket per client id (the X-Client-Id header), refilled at "
                                 "its rate")
        limited = [a for a in greedy if a.status == 429]
        if not limited:
            raise LabCheckFailed(f"{what}: no over-limit request was answered 429 ({len(greedy)} sent, statuses "
                                 f"{sorted({a.status for a in greedy})}); refuse a client's request when its bucket is "
                                 "empty: 429 Too Many Requests with a Retry-After header")
        for a in limited:
            value = a.headers.get("retry-after", "")
            try:
                seconds = float(value)
            except ValueError:
                seconds = float("nan")
            if not (0 < seconds <= math.ceil(1 / cfg.rate) + 1):
                raise LabCheckFailed(f"{what}: a 429 carried Retry-After {value!r}; give the seconds until the client's "
                                     f"next token, rounded up to a whole second (here 1)")
        for k in range(sk.GREEDY_CLIENTS):
            mine = [a for a in greedy if a.client == f"greedy-{k}"]
            admitted = [a for a in mine if a.status != 429]
            span = max(a.sent for a in mine) - min(a.sent for a in mine)
            allowed = cfg.burst + cfg.rate * span + 2
            if len(admitted) > allowed:
                raise LabCheckFailed(f"{what}: client greedy-{k} had {len(admitted)} requests admitted over {span:.2f} s, "
                                     f"more than burst + rate*t (+2) = {allowed:.1f}")
        p99_base = sk.p99([a.latency for a in base])
        p99_loaded = sk.p99([a.latency for a in steady])
        bound = max(P99_FACTOR * p99_base, p99_base + P99_SLACK_S)
        record("steady baseline p99", p99_base * 1000, unit="ms")
        record("steady loaded p99", p99_loaded * 1000, target=bound * 1000, unit="ms")
        record("429s", len(limited))
        record("cpu contention (grader)", cpu_contention(), unit="x")  # widens the report's P99s (lab.yaml)
        if p99_loaded > bound:
            raise LabCheckFailed(f"{what}: the under-limit client's P99 latency rose from {p99_base * 1000:.0f} ms alone "
                                 f"to {p99_loaded * 1000:.0f} ms under the others' load (bound {bound * 1000:.0f} ms): "
                                 "the over-limit clients' excess must be refused before it takes a slot or a queue place")


@pytest.mark.check("deadline")
def test_deadline(served, record):
    with served.teaching():
        a = served.phases["deadline"].get()["answer"]
        what = (f"a request with timeout_s {sk.DEADLINE_S} and max_tokens {sk.DEADLINE_TOKENS} (about "
                f"{sk.DEADLINE_TOKENS * served.cfg.token_ms / 1000:.1f} s of generation)")
        if not a.status:
            raise LabCheckFailed(f"{what}: no answer ({a.error})")
        record("deadline answer", a.latency * 1000, target=(sk.DEADLINE_S + DEADLINE_EPS_S) * 1000, unit="ms")
        if a.status == 200:
            raise LabCheckFailed(f"{what} was answered 200 after {a.latency:.2f} s: a request past its deadline must be "
                                 "ended with 504 Gateway Timeout (or 408), not completed")
        if a.status not in (504, 408):
            raise LabCheckFailed(f"{what} was answered HTTP {a.status} ({a.body[:150]!r}); answer 504 at its deadline")
        if a.latency > sk.DEADLINE_S + DEADLINE_EPS_S:
            raise LabCheckFailed(f"{what} was answered {a.status} only {a.latency:.2f} s after it was sent; answer by the "
                                 f"deadline ({sk.DEADLINE_S} s, + {DEADLINE_EPS_S} s of slack): the deadline counts from "
                                 "the request's arrival, waiting included (asyncio.wait_for with the time left)")
        if a.latency < sk.DEADLINE_S * 0.9:
            raise LabCheckFailed(f"{what} was answered {a.status} after {a.latency:.2f} s, before its deadline; end it "
                                 "at the deadline, not earlier")


@pytest.mark.check("bounded-queue")
def test_bounded_queue(served, record):
    with served.teaching():
        b = served.phases["burst"].get()
        cfg, answers = served.cfg, b["answers"]
        capacity = cfg.max_concurrency + cfg.max_queue
        what = (f"{b['n']} requests at once from {b['n']} clients ({cfg.max_concurrency} generating + {cfg.max_queue} "
                "queued fit)")
        _no_errors(answers, what)
        refused = [a for a in answers if a.status == 503]
        accepted = [a for a in answers if a.status == 200]
        depth = max(b["depths"], default=float("nan"))
        record("503s", len(refused))
        if b["depths"]:
            record("max queue depth", depth)
        if not refused:
            raise LabCheckFailed(f"{what}: none was refused (statuses {sorted({a.status for a in answers})}, "
                                 f"{len(accepted)} accepted). Bound the queue: when {capacity} requests are generating or "
                                 "waiting, answer the next one 503 at once")
        slow = max(a.latency for a in refused)
        if slow > REFUSAL_S:
            raise LabCheckFailed(f"{what}: a 503 took {slow:.2f} s to arrive; refuse at once, before waiting or working")
        other = [a for a in answers if a.status not in (200, 503)]
        if other:
            raise LabCheckFailed(f"{what}: {len(other)} answered neither 200 nor 503 (HTTP {other[0].status} "
                                 f"{other[0].body[:150]!r}); an accepted request completes, a refused one gets 503")
        if not b["depths"]:
            raise LabCheckFailed(f"{what}: /metrics never showed service_queue_depth while the burst ran")
        if depth > cfg.max_queue:
            raise LabCheckFailed(f"{what}: /metrics showed service_queue_depth {depth:g}, more than max_queue "
                                 f"({cfg.max_queue})")
        most = sk.max_overlap([(a.sent, a.answered) for a in accepted])
        if most > capacity + OVERLAP_SLACK:
            raise LabCheckFailed(f"{what}: the judge saw {most} accepted requests open at once, more than the "
                                 f"{capacity} the slots and the queue hold")
