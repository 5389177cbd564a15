"""KV blocks come back: after the load point nothing runs and every block is free, and a client that goes away
mid-stream is aborted at once (its blocks free long before its generation could have ended)."""
import pytest

from infracourse.grader import LabCheckFailed
from week17_judging import check_outputs


@pytest.mark.check("blocks-freed")
def test_blocks_freed_after_the_load(served):
    load = served.phases["load"].get()
    idle, samples, total = load["idle"], load["samples"], served.cfg.num_blocks
    if idle["num_blocks"] != total:
        raise LabCheckFailed(f"/debug/state reports num_blocks {idle['num_blocks']}, but the server was started "
                             f"with num_blocks {total} (INFRACOURSE_SERVE): build the pool from ServeConfig.from_env()")
    if not samples:
        raise LabCheckFailed("/debug/state never answered while the load point ran")
    busiest = max(s["running"] for s in samples)
    least_free = min(s["free_blocks"] for s in samples)
    if busiest < 2 or least_free >= total:
        raise LabCheckFailed(
            f"while 32 requests were in flight, /debug/state never showed more than {busiest} running sequence(s) "
            f"and at least {least_free} of {total} blocks free: it must report the engine's live state "
            "(running sequences, free blocks), and the engine must batch the running sequences")
    if idle["free_blocks"] != total or idle["running"] or idle["waiting"]:
        raise LabCheckFailed(
            f"after every request of the load point had ended, /debug/state still shows {idle['running']} running, "
            f"{idle['waiting']} waiting and {total - idle['free_blocks']} of {total} blocks in use (after "
            f"{load['idle_after_s']:.1f} s): a finished sequence must leave the running set and give back every block")


@pytest.mark.check("disconnect-frees")
def test_disconnect_frees_blocks(served, judge_model):
    d = served.phases["disconnect"].get()
    during, after, before = d["during"], d["after"], d["before"]
    if d["chunks"] < 2:
        raise LabCheckFailed(f"the probe (prompt 8 tokens, max_tokens 120) streamed {d['chunks']} content chunk(s) "
                             "before its stream ended; expected a stream of tokens")
    if during["running"] < 1 or during["free_blocks"] >= before["free_blocks"]:
        raise LabCheckFailed(f"while the probe streamed, /debug/state showed {during['running']} running and "
                             f"{during['free_blocks']} free blocks ({before['free_blocks']} before it): it must report "
                             "the live engine")
    if after["running"] or after["waiting"] or after["free_blocks"] != before["free_blocks"]:
        raise LabCheckFailed(
            f"the judge closed its connection after 2 of 120 tokens; {d['window_s']:.2f} s later (half the time the "
            f"rest of the generation needs) /debug/state shows {after['running']} running, {after['waiting']} "
            f"waiting, {after['free_blocks']} free blocks ({before['free_blocks']} before the request). A client that "
            "disconnects must cancel its request: when the stream is closed (the generator is cancelled, or "
            "request.is_disconnected()), abort the sequence in the engine and free its blocks")
    spec, rec = d["next"]
    if not rec.success:
        raise LabCheckFailed(f"after the disconnect, a new request (prompt 8, max_tokens 6) failed: {rec.error[:300]}")
    check_outputs(judge_model, [spec], [rec], "the request after the disconnect")
