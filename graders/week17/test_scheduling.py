"""The scheduler's rules, in the conditions they exist for (the pressure phase): the course's ModelRunner journals
every step's pieces, and the judge holds them against the token budget and the batch size (every step of the
grade), against preemption by recomputation (the pool cannot hold the running sequences), and against first
come, first served (a preempted request goes back to the front: no later arrival passes it). The journal is
written in the server's process: it can fail these checks, never pass one alone (the outputs are the judge's)."""
import pytest

from infracourse.grader import LabCheckFailed
from week17_judging import FIRST, FIRST_NEW, FIRST_PROMPT, LATE, check_outputs, read_journal, residencies

NOT_RUNNER = ("no step of your server went through the course's ModelRunner.step (kit.batching), which journals "
              "every step for the judge: call runner.step(pieces) once per engine step")


def pressure(served, judge_model) -> dict:
    """The pressure phase's evidence, its requests' outputs checked (every one succeeded, greedy)."""
    p = served.phases["pressure"].get()
    for name in ("pacer", "first", "late"):
        specs = [p[name]] if name == "pacer" else p[name]
        records = p["records"].get(name)
        if records is None:
            raise served.failed(f"the pressure phase's {name} requests got no answer within 60 s")
        failed = [(i, r.error) for i, r in enumerate(records) if not r.success]
        if failed:
            raise served.failed(f"the pressure phase ({FIRST} requests of {FIRST_PROMPT} + {FIRST_NEW} tokens at "
                                f"once, more than the pool holds): {len(failed)} of its {name} requests failed, "
                                f"e.g. {failed[0][1][:300]}; every accepted request must complete, however often "
                                "it is preempted")
        check_outputs(judge_model, specs, records, f"the pressure phase's {name} requests")
    if not p["steps"]:
        raise LabCheckFailed(f"the pressure phase: {NOT_RUNNER}")
    return p


@pytest.mark.check("token-budget")
def test_steps_keep_the_budget(served):
    cfg, p = served.cfg, served.phases["pressure"].get()
    steps, begin = read_journal(p["journal"]), p["begin"]  # every step of the grade so far, the load point's too
    if not steps:
        raise LabCheckFailed(NOT_RUNNER)
    for i, pieces in enumerate(steps):
        tokens = [len(t) for _, t, _ in pieces]
        where = (f"step {i} of your server's run (step {i - begin} of the pressure phase, where {FIRST} prompts of "
                 f"{FIRST_PROMPT} tokens arrived at once beside a running request)" if i >= begin else
                 f"step {i} of your server's run (the load point: 32 requests at once)")
        if sum(tokens) > cfg.max_num_batched_tokens:
            raise LabCheckFailed(
                f"{where} computed {sum(tokens)} tokens in {len(pieces)} pieces ({'+'.join(map(str, tokens[:20]))}), "
                f"more than max_num_batched_tokens ({cfg.max_num_batched_tokens}). A step's prefills and decodes "
                "together stay within the budget: admit a waiting request only while its prompt fits what is left "
                "(or split it in chunks), and stop admitting when it does not")
        if len(pieces) > cfg.max_num_seqs:
            raise LabCheckFailed(f"{where} ran {len(pieces)} sequences, more than max_num_seqs ({cfg.max_num_seqs})")


@pytest.mark.check("preemption")
def test_preemption_by_recomputation_first_come_first_served(served, judge_model):
    p = pressure(served, judge_model)
    cfg, first, late = served.cfg, [p["pacer"], *p["first"]], p["late"]
    specs = [*first, *late, p["deadline"]]
    stays = residencies(p["steps"], specs)
    need = FIRST * -(-(FIRST_PROMPT + FIRST_NEW - 1) // cfg.block_size)
    what = (f"the pressure phase ({FIRST} requests of {FIRST_PROMPT}-token prompts and {FIRST_NEW} new tokens at "
            f"once: their sequences need {need} blocks, the pool holds {cfg.num_blocks}; then {LATE} later requests)")
    missing = [i for i in range(len(first) + len(late)) if i not in stays]
    if missing:
        raise LabCheckFailed(f"{what}: request {missing[0]} (prompt of {len(specs[missing[0]].prompt_ids)} tokens) "
                             "never appears in a step starting at position 0: every sequence's (re)computation "
                             "goes through runner.step as a piece from position 0 (its prompt, or prompt + "
                             "generated tokens after a preemption)")
    preempted = {i: s for i, s in stays.items() if i < len(first) and len(s) > 1}
    if not preempted:
        raise LabCheckFailed(
            f"{what}: no request was preempted (none was computed from position 0 a second time). The reference "
            "scheduler admits while blocks are free and, when a running sequence needs a block and none is free, "
            "preempts the sequence admitted last (frees its blocks, puts it back at the FRONT of the queue) and "
            "recomputes it later; reserving blocks for max_tokens at admission runs fewer sequences than the pool "
            "allows")
    for j, req in enumerate(late, start=len(first)):
        admitted = stays[j][0][0]
        for i, s in stays.items():
            if i >= len(first):
                continue
            waits = [(-1, s[0][0])] + [(s[k][1], s[k + 1][0]) for k in range(len(s) - 1)]
            for k, (lo, hi) in enumerate(waits):
                if lo < admitted < hi:
                    why = (f"preempted after step {lo} and recomputed only at step {hi}" if k else
                           f"not yet admitted; admitted at step {hi}")
                    raise LabCheckFailed(
                        f"{what}: at step {admitted} of the phase, request {j} (sent after every one of the first "
                        f"{len(first)} had arrived) was admitted while request {i}, which arrived before it, "
                        f"waited ({why}). First come, first served: a preempted request goes back to the FRONT of "
                        "the waiting queue, and no later request passes the head of the queue")
