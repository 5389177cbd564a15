"""Admission: a bounded queue refuses at once (429 or 503) what it cannot hold, a request past its deadline is
ended and its blocks freed, and a long prompt is not starved by a crowd of short ones."""
from types import SimpleNamespace

import pytest

from infracourse.grader import LabCheckFailed
from week17_judging import DEADLINE_SLACK_S, FILL_WAIT_S, STARVE_LONG_AT, STARVE_SHORTS, check_outputs, median


@pytest.mark.check("backpressure")
def test_bounded_queue(served, judge_model):
    b = served.phases["burst"].get()
    cfg, answers, specs = served.cfg, b["answers"], b["specs"]
    what = f"{b['n']} requests at once (max_num_seqs {cfg.max_num_seqs} + max_waiting {cfg.max_waiting} + 32)"
    if any(a is None for a in answers):
        raise LabCheckFailed(f"{what}: {sum(a is None for a in answers)} got no complete answer within 90 s")
    refused = [a for a in answers if a["status"] in (429, 503)]
    most_waiting = max(s["waiting"] for s in b["samples"])
    if not refused:
        raise LabCheckFailed(
            f"{what}: none was refused (at most {most_waiting} waiting at once, by /debug/state). The queue must be "
            f"bounded: with max_waiting ({cfg.max_waiting}) requests waiting, answer a new one 429 (or 503) at once, "
            "before streaming, instead of letting the queue and every latency grow")
    slow = max(a["status_s"] for a in refused)
    if slow > 1.0:
        raise LabCheckFailed(f"{what}: a refusal took {slow:.2f} s to arrive; refuse at once, before any work")
    if most_waiting > cfg.max_waiting:
        raise LabCheckFailed(f"{what}: /debug/state showed {most_waiting} requests waiting, more than max_waiting "
                             f"({cfg.max_waiting})")
    other = [a for a in answers if a["status"] not in (200, 429, 503) or (a["status"] == 200 and not a["done"])]
    if other:
        a = other[0]
        raise served.failed(f"{what}: {len(other)} request(s) neither refused nor completed (HTTP {a['status']}, "
                            f"{len(a['text'])} tokens, no [DONE]) {a['error'][:200]}; an accepted request must "
                            "complete")
    accepted = [(spec, a) for spec, a in zip(specs, answers) if a["status"] == 200]
    check_outputs(judge_model, [s for s, _ in accepted],
                  [SimpleNamespace(success=True, text=a["text"]) for _, a in accepted], what)


@pytest.mark.check("request-timeout")
def test_request_timeout(served):
    idle_probe(served)
    p = served.phases["pressure"].get()
    d, ahead = p["deadline_seen"], p["ahead"]
    what = (f"a request with timeout_s {d['timeout_s']:g} sent while {ahead['running']} requests ran and "
            f"{ahead['waiting']} waited ahead of it (the pressure phase: first come, first served, it cannot be "
            "admitted before its deadline)")
    complete = d["status"] == 200 and (d["done"] or d["content"] >= d["max_tokens"])
    if complete or d["ended_s"] > d["timeout_s"] + DEADLINE_SLACK_S:
        raise LabCheckFailed(
            f"{what} ended {d['ended_s']:.2f} s after it was sent{' with all its tokens' if complete else ''}. A "
            "deadline counts from the request's ARRIVAL (when the server received it), not from its admission or "
            "its first token: a request still waiting at its deadline is ended then (removed from the queue, an "
            "error event or 408/504)" + (". Served at all, it also passed the requests ahead of it: admit in "
                                        "arrival order" if complete else ""))


def idle_probe(served) -> None:
    """The deadline on an idle server: the request is admitted at once and must end mid-generation."""
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
    what = (f"with every slot and block taken by {served.cfg.max_num_seqs} running requests, {STARVE_SHORTS + 1} "
            f"more at once, 8-token prompts and 8 new tokens, number {STARVE_LONG_AT + 1} a 100-token prompt")
    full, fillers = s["full"], s["fillers"] or []
    if full["running"] < served.cfg.max_num_seqs:  # the probe's condition never held: it proves nothing
        raise LabCheckFailed(
            f"the starvation probe sends {served.cfg.max_num_seqs} one-token prompts at once to take every slot, "
            f"but {FILL_WAIT_S:g} s later /debug/state showed {full['running']} running and {full['waiting']} "
            "waiting: admit waiting requests into the running batch at every step, up to max_num_seqs")
    if len(fillers) != served.cfg.max_num_seqs or not all(r.success for r in fillers):
        failed = [r.error[:200] for r in fillers if not r.success]
        raise served.failed(f"{what}: of the {served.cfg.max_num_seqs} requests that took the slots, "
                            f"{len(fillers) - len(failed)} completed within 30 s ({len(failed)} failed"
                            f"{': ' + failed[0] if failed else ''}); an accepted request must complete")
    if not long.success:
        raise served.failed(f"{what}: the long prompt's request failed ({long.error[:300]})")
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
