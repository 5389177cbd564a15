"""Week 19 exact resume: the judge runs an epoch of the learner's pipeline (with a prefetcher, and without),
takes state_dict() after a seeded number of batches the loop has received (and a training step's pause, in
which a prefetcher fills its queue), and restores it with
load_state_dict() in a FRESH process: the resumed stream must hand out exactly the samples the interrupted one
had not, in the same order."""
import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.datapipe import PREFETCH
from week19_judging import flat

STEP_S = 0.3  # the training step between receiving batch k and saving: a prefetcher runs ahead meanwhile


@pytest.mark.check("resume-exact")
def test_resume_yields_exactly_the_unseen_samples(harness, built, plan):
    cases = [{"cfg": plan.cfg(prefetch=PREFETCH), "at": plan.stop_at[0]},
             {"cfg": plan.cfg(rank=1, world_size=2, worker=1, num_workers=2), "at": plan.stop_at[1]}]
    with harness.storage(built.root) as server:
        saved = harness.run(server, plan.spec, {"task": "checkpoint", "manifest": built.manifest, "cases": cases,
                                                  "step_s": STEP_S},
                            "an epoch with state_dict() taken mid-way")
        full = {line["case"]: line for line in saved.results("case")}
        if len(full) != len(cases):
            raise LabCheckFailed("the interrupted epochs ended without a result")
        resume = [{"cfg": case["cfg"], "state": full[k]["state"]} for k, case in enumerate(cases)]
        for k, case in enumerate(resume):
            if case["state"] is None:
                raise LabCheckFailed(f"the epoch of {cases[k]['cfg']} ended before batch {cases[k]['at']}")
        resumed = harness.run(server, plan.spec, {"task": "resume", "manifest": built.manifest, "cases": resume},
                              "load_state_dict(state) in a fresh process, then the rest of the epoch")
        again = {line["case"]: flat(line["batches"]) for line in resumed.results("case")}
        for k, case in enumerate(cases):
            whole = flat(full[k]["batches"])
            seen = flat(full[k]["batches"][:case["at"]])
            expected, got = whole[len(seen):], again.get(k, [])
            what = (f"make_pipeline({', '.join(f'{a}={b}' for a, b in case['cfg'].items())}) interrupted after "
                    f"{case['at']} batches ({len(seen)} samples), state {str(full[k]['state'])[:120]}, resumed in a "
                    f"new process (seed {plan.seed})")
            if got != expected:
                _same_order_in_another_process(harness, server, plan, built, case["cfg"], whole, what)
                _say_what_differs(what, seen, expected, got)


def _same_order_in_another_process(harness, server, plan, built, cfg: dict, whole: list[int], what: str) -> None:
    """Before blaming the saved position: the same epoch, run whole in yet another fresh process, must hand out the
    order the interrupted process did; a shuffle that differs between processes (hash() of a str, which Python
    salts per process; a set's order; id()) can never resume, whatever the state holds."""
    other = harness.run(server, plan.spec, {"task": "ids", "manifest": built.manifest, "streams": [cfg]},
                        "the same epoch from its start in another fresh process")
    ids = next((line["ids"] for line in other.results("stream")), None)
    if ids is not None and ids != whole:
        first = next((i for i, (a, b) in enumerate(zip(ids, whole)) if a != b), min(len(ids), len(whole)))
        raise LabCheckFailed(
            f"{what}: the same epoch, run from its start in two processes, hands out its samples in different "
            f"orders (first difference at sample {first}), so no saved position can resume it. The order must be "
            "the same in every process: derive it from (seed, epoch) alone, e.g. random.Random(f\"{seed}/{epoch}/"
            "{name}\") or numpy's default_rng((seed, epoch)); never hash() of a str (Python salts it per process), "
            "a set's iteration order or id()")


def _say_what_differs(what: str, seen: list[int], expected: list[int], got: list[int]) -> None:
    repeated = [i for i in got if i in set(seen)]
    skipped = [i for i in expected if i not in set(got)]
    if repeated:
        raise LabCheckFailed(
            f"{what}: the resumed loader handed out {len(repeated)} samples the interrupted run had already "
            f"given the training loop (e.g. {repeated[:3]}). The state must count what the loop RECEIVED, up "
            "to and including the last batch, and the resumed loader must start right after it")
    if skipped:
        raise LabCheckFailed(
            f"{what}: {len(skipped)} samples the interrupted run had not yet handed out never came after the "
            f"resume (e.g. {skipped[:3]}). A prefetcher's loader runs ahead of the loop: save the position of "
            "the last batch the loop received, not the loader's own")
    raise LabCheckFailed(f"{what}: the resumed loader gave {len(got)} samples, the rest of the epoch is "
                         f"{len(expected)}, and their order differs (first difference at position "
                         f"{next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)}): a restored "
                         "loader must re-create the same shard and sample order from (seed, epoch)")
