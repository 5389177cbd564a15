"""The token bucket alone, on the course's fake clock (infracourse.kit.service_kit.FakeClock): your class is
built and called in the grading worker, time moves only when the judge says."""
import math

import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit import service_kit


EPS = 1e-6


def script(rate: float, burst: int) -> list:
    """At t=0 burst + 2 attempts; then 60 steps of a fifth of a token's time with 2 attempts each; a retry after
    exactly the retry_after named; 20 s idle then burst + 3 attempts; then 10 s at 3 attempts per 1/rate."""
    step = 0.2 / rate
    s = [(0.0, burst + 2)] + [(step, 2)] * 60 + [(0.0, 0, "retry"), (0.0, 1)]
    s += [(20.0, burst + 3)] + [(1.0 / rate, 3)] * int(10 * rate)
    return s


@pytest.mark.check("limiter-fake-clock")
def test_token_bucket(learner, seed):
    rate, burst = (2.5, 4.0, 8.0)[seed % 3], (2, 3, 5)[seed // 3 % 3]
    bucket_cls = learner.module("limiter").TokenBucket
    steps = script(rate, burst)
    got = learner.build(service_kit.probe_bucket, bucket_cls, rate, burst, steps)
    what = f"TokenBucket(rate={rate:g}, burst={burst}, clock=FakeClock())"
    first = got[0]["admitted"]
    if first != burst:
        raise LabCheckFailed(f"{what}: {burst + 2} calls of allow() at the same instant admitted {first}; a new "
                             f"bucket is full: it must admit its burst ({burst}) at once, and no more")
    # any window [t_i, t_j]: admitted at instants within it <= rate * (t_j - t_i) + burst
    times = [g["t"] for g in got]
    counts = [g["admitted"] for g in got]
    for i in range(len(got)):
        total = 0
        for j in range(i, len(got)):
            total += counts[j]
            allowed = rate * (times[j] - times[i]) + burst
            if total > allowed + EPS:
                raise LabCheckFailed(
                    f"{what}: from t={times[i]:.3f} s to t={times[j]:.3f} s it admitted {total} requests, more than "
                    f"rate*t + burst = {allowed:.2f}. Cap the tokens at burst when refilling (an idle client does not "
                    "save up more than its burst), and spend one token per admitted request")
    # refills at its rate: over the 60 small steps (12 tokens' worth of time) it admits about 12
    refill_time = 60 * 0.2 / rate
    admitted = sum(counts[1:61])
    if admitted < rate * refill_time - 1 - EPS:
        raise LabCheckFailed(f"{what}: over {refill_time:.2f} s of fake time after its burst was spent, with 2 "
                             f"attempts every {0.2 / rate:.3f} s, it admitted {admitted}; refilling at {rate:g} per "
                             f"second it should admit {rate * refill_time:.0f}. Add (now - last refill) * rate tokens "
                             "on every call, using the clock you were given")
    refusals = [g["retry_after"] for g in got[1:61] if g["retry_after"] is not None]
    bad = [r for r in refusals if not (0 < r <= 1 / rate + EPS) or math.isnan(r)]
    if not refusals or bad:
        raise LabCheckFailed(f"{what}: after a refusal retry_after() answered {bad[:3] or 'nothing'}; it must be the "
                             f"seconds until the next token, more than 0 and at most 1/rate = {1 / rate:.3f}")
    if got[62]["admitted"] != 1:
        raise LabCheckFailed(f"{what}: a request refused, then retried just after the retry_after() it named "
                             f"({got[60]['retry_after']} s), was refused again: "
                             "retry_after must not promise a token before there is one")
    idle = got[63]["admitted"]
    if idle != burst:
        raise LabCheckFailed(f"{what}: after 20 s idle, {burst + 3} attempts at once admitted {idle}; a full bucket "
                             f"admits exactly its burst ({burst})")
    sustained = sum(counts[64:])
    expected = int(10 * rate)
    if not expected - 1 <= sustained <= expected + 1:
        raise LabCheckFailed(f"{what}: 10 s at 3 attempts every 1/rate admitted {sustained}, expected {expected} "
                             f"(one per 1/rate)")
