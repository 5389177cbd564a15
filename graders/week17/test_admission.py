"""Admission: a bounded queue refuses at once (429 or 503) what it cannot hold, a request past its deadline is
ended and its blocks freed, and a long prompt is not starved by a crowd of short ones."""
import pytest

from conftest import STARVE_RATE, check_outputs, median
from infracourse.guard import LabCheckFailed

REFUSED = ("HTTP 429", "HTTP 503")


@pytest.mark.check("backpressure")
def test_bounded_queue(served, judge_model):
    b = served.phases["burst"].get()
    cfg, records = served.cfg, b["records"]
    if records is None:
        raise LabCheckFailed(f"the burst of {b['n']} requests did not finish within 90 s")
    most_waiting = max(s["waiting"] for s in b["samples"])
    refused = [r for r in records if not r.success and r.error.startswith(REFUSED)]
    other = [r for r in records if not r.success and not r.error.startswith(REFUSED)]
    what = (f"{b['n']} requests at once (max_num_seqs {cfg.max_num_seqs} + max_waiting {cfg.max_waiting} + 32)")
    if most_waiting > cfg.max_waiting or b["probe_status"] not in (429, 503):
        seen = (f"one more sent while {cfg.max_waiting} waited was answered HTTP {b['probe_status']}"
                if b["probe_status"] is not None else f"the queue never held {cfg.max_waiting} requests")
        raise LabCheckFailed(
            f"{what}: {len(refused)} refused, at most {most_waiting} waiting at once; {seen}. The queue must be "
            f"bounded: with max_waiting ({cfg.max_waiting}) requests waiting, answer a new one 429 (or 503) at once, "
            "before streaming, instead of letting the queue and every latency grow")
    if b["probe_s"] is not None and b["probe_s"] > 1.0:
        raise LabCheckFailed(f"{what}: the refusal took {b['probe_s']:.2f} s; refuse at once, before any work")
    if other:
        raise LabCheckFailed(f"{what}: {len(other)} request(s) failed other than by a refusal: {other[0].error[:300]}"
                             "; an accepted request must complete")
    check_outputs(judge_model, b["specs"], records, what)


@pytest.mark.check("request-timeout")
def test_request_timeout(served):
    t = served.phases["timeout"].get()
    what = (f"a request with timeout_s {t['timeout_s']:.2f} and max_tokens {t['max_tokens']} (its generation takes "
            "longer)")
    if t["status"] == 200 and (t["done"] or t["content"] >= t["max_tokens"]):
        raise LabCheckFailed(f"{what} completed all its tokens in {t['ended_s']:.2f} s: a request past its deadline "
                             "must be aborted (end the stream with an error event, or answer 408/504 before streaming)")
    if t["ended_s"] > t["timeout_s"] + 1.0:
        raise LabCheckFailed(f"{what} ended only after {t['ended_s']:.2f} s; end it at its deadline")
    before, after = t["before"], t["after"]
    if after["running"] or after["waiting"] or after["free_blocks"] != before["free_blocks"]:
        raise LabCheckFailed(f"{what} timed out, but /debug/state then shows {after['running']} running, "
                             f"{after['free_blocks']} free blocks ({before['free_blocks']} before): abort it in the "
                             "engine and free its blocks")


@pytest.mark.check("no-starvation")
def test_long_prompt_not_starved(served):
    s = served.phases["starvation"].get()
    records, li = s["records"], s["long_index"]
    long = records[li]
    what = (f"48 requests arriving at {STARVE_RATE:g}/s (Poisson), 8-token prompts and 8 new tokens, the 9th "
            "one a 100-token prompt")
    if not long.success:
        raise LabCheckFailed(f"{what}: the long prompt's request failed ({long.error[:300]})")
    later = [r.send_time + r.ttft for r in records[li + 1:] if r.success]
    if len(later) < (len(records) - li - 1) // 2:
        raise LabCheckFailed(f"{what}: only {len(later)} of the {len(records) - li - 1} short requests sent after the "
                             "long one succeeded; an accepted request must complete")
    first = long.send_time + long.ttft
    if first > median(later):
        after = sum(t < first for t in later)
        raise LabCheckFailed(
            f"{what}: the long prompt got its first token {long.ttft * 1000:.0f} ms after it was sent, after "
            f"{after} of the {len(later)} short requests sent AFTER it had theirs: the scheduler starves long "
            "prompts. Admit in arrival order: when the head of the queue does not fit this step's token budget or "
            "the free blocks, wait for room instead of letting later, shorter requests pass it")
