"""Eyes: /metrics agrees with what the judge counted, and every request can be followed in the log by its id."""
import math
from collections import Counter

import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit import service_kit as sk

COUNTER, HIST = "service_requests_total", "service_request_duration_seconds"
LOG_SLACK_S = 0.25  # a server's own latency cannot exceed the judge's by more than this


def _ledger(served):
    lost = [a for a in served.answers if not a.status]
    if lost:
        raise LabCheckFailed(f"{len(lost)} of the judge's {len(served.answers)} completions got no HTTP answer "
                             f"({lost[0].error}); the counts cannot be compared")
    return served.answers


@pytest.mark.check("metrics-agree")
def test_metrics_agree(served, record):
    with served.teaching():
        f = served.phases["final"].get()
        answers = _ledger(served)
        samples = f["samples"]
        judge = Counter(a.outcome for a in answers)
        theirs = {dict(labels).get("outcome"): v for (name, labels), v in samples.items() if name == COUNTER}
        what = (f"after {len(answers)} completions ({dict(judge)} by the judge's count: 200 ok, 429 rate_limited, 503 "
                "rejected, 504 timeout)")
        if not theirs:
            raise LabCheckFailed(f"{what}: /metrics has no {COUNTER}{{outcome=\"...\"}} samples; count every answered "
                                 "completion by its outcome")
        wrong = {o: (judge.get(o, 0), theirs.get(o, 0.0)) for o in set(judge) | set(theirs)
                 if o is not None and judge.get(o, 0) != theirs.get(o, 0.0)}
        if wrong:
            detail = ", ".join(f"{o}: judge {j}, yours {t:g}" for o, (j, t) in sorted(wrong.items()))
            raise LabCheckFailed(f"{what}: {COUNTER} disagrees ({detail}). Count each answer once, where it is answered "
                                 "(a refusal counted where it is decided and again where it is sent is counted twice)")
        count = samples.get((f"{HIST}_count", ()))
        buckets = sorted(((float(dict(labels)["le"]), v) for (name, labels), v in samples.items()
                          if name == f"{HIST}_bucket" and "le" in dict(labels)), key=lambda x: x[0])
        if count is None or not buckets:
            raise LabCheckFailed(f"{what}: /metrics has no {HIST} histogram ({HIST}_bucket{{le=...}}, _sum, _count)")
        record("requests counted", count)
        if count != len(answers):
            raise LabCheckFailed(f"{what}: {HIST}_count is {count:g}; observe every completion's latency once, whatever "
                                 "its outcome")
        values = [v for _, v in buckets]
        if buckets[-1][0] != math.inf or values[-1] != count or any(b < a for a, b in zip(values, values[1:])):
            raise LabCheckFailed(f"{what}: the {HIST} buckets must be cumulative (each le counts every observation <= "
                                 f"it) and end with le=\"+Inf\" equal to _count; got {buckets}")
        total = samples.get((f"{HIST}_sum", ()))
        judged = sum(a.latency for a in answers)
        if total is None or not 0 <= total <= judged + 0.05 * len(answers):
            raise LabCheckFailed(f"{what}: {HIST}_sum is {total}, the judge measured {judged:.2f} s in all: sum each "
                                 "request's latency in seconds")
        depth = samples.get(("service_queue_depth", ()))
        if depth != 0:
            raise LabCheckFailed(f"{what}: with nothing in flight, service_queue_depth reads {depth}; expected 0")


@pytest.mark.check("request-logs")
def test_request_logs(served, record):
    with served.teaching():
        answers = _ledger(served)
        lines = sk.json_lines(served.log)
        by_id: dict[str, list] = {}
        for line in lines:
            rid = line.get("request_id")
            if isinstance(rid, str):
                by_id.setdefault(rid, []).append(line)
        ids = [a.headers.get("x-request-id", "") for a in answers]
        if not all(ids):
            a = answers[ids.index("")]
            raise LabCheckFailed(f"a completion answered HTTP {a.status} carried no X-Request-Id header; give every "
                                 "answer (refusals too) a request id and send it back in X-Request-Id")
        if len(set(ids)) != len(ids):
            raise LabCheckFailed(f"{len(ids) - len(set(ids))} request ids repeat among {len(ids)} answers; each request "
                                 "gets its own id")
        for a, rid in zip(answers, ids):
            mine = by_id.get(rid, [])
            said = f"a completion answered HTTP {a.status} ({a.outcome}) with X-Request-Id {rid}"
            if len(mine) != 1:
                raise LabCheckFailed(f"{said} appears in {len(mine)} JSON log lines with \"request_id\" (of "
                                     f"{len(lines)} JSON lines on your server's stdout); log exactly one line per request "
                                     "when it is answered: request_id, outcome, latency_ms")
            line = mine[0]
            if line.get("outcome") != a.outcome:
                raise LabCheckFailed(f"{said}: its log line says outcome {line.get('outcome')!r}; expected {a.outcome!r} "
                                     "(the same names as the metrics' outcome label)")
            ms = line.get("latency_ms")
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms / 1000 <= a.latency + LOG_SLACK_S:
                raise LabCheckFailed(f"{said}: its log line's latency_ms is {ms!r}, the judge measured "
                                     f"{a.latency * 1000:.0f} ms; log the request's time from arrival to answer, in ms")
        slow = [a for a in answers if a.phase == "deadline"]
        for a in slow:
            ms = by_id[a.headers["x-request-id"]][0]["latency_ms"]
            if ms / 1000 < 0.8 * sk.DEADLINE_S:
                raise LabCheckFailed(f"the slow request (deadline {sk.DEADLINE_S} s) logged latency_ms {ms}: measure from "
                                     "its arrival to its answer, so that a slow request shows how slow it was")
        record("requests followed", len(answers))
