"""Speculative decoding with the kit's draft/target pair (infracourse.kit.speculative), judged by recount.

spec-greedy      speculative_generate's tokens equal the target's greedy output exactly: seeded prompts,
                 several k, batch 1 and a batch of equal-length prompts.
spec-acceptance  every round's accepted count recomputed here (greedy verification is deterministic: the
                 target's greedy output and the draft's greedy proposal at that point fix it); the reported
                 acceptance rate equals accepted / drafted over those rounds; the target, wrapped in the
                 course's CountedModel, ran at most once per round (+1).
spec-speedup     the judge's clock (on a CPU the worker's CPU seconds, read from the kernel), alternated call by
                 call in one worker: speculative_generate (k = 4) against batched greedy generation with the
                 target alone, batch 1, 2, 4, 8, fresh prompts for every timed call (each output checked); batch 1
                 must reach lab.yaml's threshold. Every timed call is counted (CountedModel around the target
                 and the draft): the target runs at least once per k + 1 tokens and the draft at least once per
                 round, so a result remembered from an earlier call fails; a speed-up above k + 1 (the most
                 tokens one target pass can yield) is more than speculation can give and fails too.
                 The first batch where speculation is slower than plain decoding is recorded (the
                 load at which it stops helping; 16 when it never does up to 8).
"""
import random

import pytest

from infracourse.kit.generate import seeded_prompts
from infracourse.kit.speculative import CountedModel, batched_greedy, counts, draft_model, replay, target_model
from week18_judging import learner_speculative, require

N_NEW = 40
SPEED_K, SPEED_NEW, BATCHES = 4, 32, (1, 2, 4, 8)


@pytest.fixture(scope="module")
def spec(learner):
    return learner_speculative(learner)


@pytest.fixture(scope="module")
def pair(learner):
    """(judge's target, judge's draft, worker target counted, worker draft)."""
    counted = learner.build(CountedModel, learner.build(target_model, 0))
    return target_model(0), draft_model(0), counted, learner.build(draft_model, 0)


def call(spec, pair, prompts, k, n, what):
    out = spec.speculative_generate(pair[2], pair[3], prompts, k, n)
    require(isinstance(out, tuple) and len(out) == 2, f"{what}: speculative_generate must return (tokens, stats), "
            f"got {type(out).__name__}")
    tokens, stats = out
    require(isinstance(tokens, list) and len(tokens) == len(prompts)
            and all(isinstance(t, list) and len(t) == n and all(type(x) is int for x in t) for t in tokens),
            f"{what}: tokens must be {len(prompts)} lists of {n} ints, one per prompt, got {tokens!r:.200}")
    require(isinstance(stats, dict) and isinstance(stats.get("rounds"), list)
            and all(isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) for r in stats["rounds"])
            and isinstance(stats.get("acceptance_rate"), (int, float)),
            f"{what}: stats must be {{'rounds': [[drafted, accepted], ...], 'acceptance_rate': float}}, got "
            f"{stats!r:.200}")
    return tokens, stats


def cases(seed):
    r = random.Random(seed)
    out = []
    for i, (k, batch) in enumerate(((1, 1), (3, 1), (5, 1), (4, 3))):
        prompts = seeded_prompts(batch, 256, 1, 1, seed=seed + i)
        length = r.randint(4, 20)
        prompts = [p * length for p in prompts] if r.random() < 0.2 else \
            seeded_prompts(batch, 256, length, length, seed=seed + 10 + i)
        out.append((k, prompts, f"seed {seed}: k = {k}, {batch} prompt(s) of {length} tokens, {N_NEW} new"))
    return out


@pytest.mark.check("spec-greedy")
def test_output_is_the_targets_greedy_output(spec, pair, seed):
    for k, prompts, what in cases(seed):
        tokens, _ = call(spec, pair, prompts, k, N_NEW, what)
        truth = batched_greedy(pair[0], prompts, N_NEW)
        for b, (got, want) in enumerate(zip(tokens, truth)):
            if got != want:
                i = next(i for i, (x, y) in enumerate(zip(got, want)) if x != y)
                raise AssertionError(
                    f"{what}: sequence {b}'s token {i} is {got[i]}, the target's greedy token is {want[i]} (tokens "
                    "before it agree). Accept a drafted token only where it EQUALS the target's argmax at its "
                    "position, stop at the first mismatch, and append the target's own token there")


@pytest.mark.check("spec-acceptance")
def test_acceptance_recounted(spec, pair, learner, seed):
    target, draft, counted = pair[0], pair[1], pair[2]
    runs = cases(seed + 1)
    k, prompts, what = runs[0]  # the first call once more: a decoder that remembers results runs nothing
    for k, prompts, what in [*runs, (k, prompts, f"{what}, the same call a second time")]:
        before = counted.calls
        _, stats = call(spec, pair, prompts, k, N_NEW, what)
        calls = counted.calls - before
        rounds = stats["rounds"]
        found, problem = replay(target, draft, prompts, N_NEW, rounds)
        require(problem is None, f"{what}: your rounds {rounds} do not replay: {problem}")
        for j, ((drafted, accepted), recount) in enumerate(zip(rounds, found)):
            require(drafted <= k, f"{what}: round {j} drafted {drafted} tokens, k is {k}")
            require(accepted == recount, f"{what}: round {j} reports {accepted} of {drafted} drafted tokens accepted; "
                    f"the draft's greedy proposal there matches the target's greedy tokens for {recount} (the "
                    f"{'shortest over the batch' if len(prompts) > 1 else 'longest matching prefix'})")
        drafted, accepted = sum(r[0] for r in rounds), sum(r[1] for r in rounds)
        rate = accepted / drafted if drafted else 0.0
        require(abs(stats["acceptance_rate"] - rate) <= 1e-9,
                f"{what}: you report an acceptance rate of {stats['acceptance_rate']:.4f}; your rounds accepted "
                f"{accepted} of {drafted} drafted tokens: {rate:.4f}. The rate counts drafted tokens only: the "
                "target's own token at the end of a round (correction or bonus) was never drafted")
        least = -(-N_NEW // (k + 1))  # a round yields at most k + 1 tokens, for one target pass
        require(len(rounds) >= least and calls >= len(rounds),
                f"{what}: the target, counted by the course's CountedModel, ran {calls} times for {len(rounds)} "
                f"rounds; {N_NEW} tokens at most {k + 1} per round need at least {least} rounds, each with one "
                "target pass over context + proposal. A result kept from an earlier call is not speculation")
        require(calls <= len(rounds) + 1,
                f"{what}: the target ran {calls} times for {len(rounds)} rounds: verify all of a round's drafted "
                "tokens in ONE target forward pass over context + proposal")


def timed_pair(fn, baseline, prompts, clock, tally):
    """Fastest time of each, the two calls alternated on each of `prompts` (fresh prompts for every timed
    call) so that both see the same load on a shared machine; per call: (fn's output, what `tally()` reads
    before and after it, off the clock, baseline's output)."""
    best, outs = [float("inf"), float("inf")], []
    for batch in prompts:
        before = tally()
        t0 = clock()
        out = fn(batch)
        best[0] = min(best[0], clock() - t0)
        after = tally()
        t0 = clock()
        plain = baseline(batch)
        best[1] = min(best[1], clock() - t0)
        outs.append((out, [a - b for a, b in zip(after, before)], plain))
    return best, outs


@pytest.mark.check("spec-speedup")
def test_speedup_and_where_it_stops(spec, learner, record, lab_check, seed, device):
    target = target_model(0)
    clock = learner.worker.clock(device)  # both calls run in the worker; on a CPU its CPU seconds
    plain_target = learner.build(target_model, 0)
    remote_target = learner.build(CountedModel, learner.build(target_model, 0))
    remote_draft = learner.build(CountedModel, learner.build(draft_model, 0))
    speedups, stop = {}, 16
    least = -(-SPEED_NEW // (SPEED_K + 1))  # target passes: a round yields at most k + 1 tokens

    def tally():  # forward calls of the target and of the draft so far, read in the worker
        return [learner.build(counts, m)[0] for m in (remote_target, remote_draft)]

    for batch in BATCHES:
        repeats = 5 if batch == 1 else 2
        fresh = [seeded_prompts(batch, 256, 16, 16, seed=seed + 1000 * r + batch) for r in range(repeats + 1)]
        what = f"batch {batch}: prompts of 16 tokens (seed {seed + batch}), k = {SPEED_K}, {SPEED_NEW} new"
        spec.speculative_generate(remote_target, remote_draft, fresh[0], SPEED_K, 2)  # warm-up
        (t_spec, t_plain), outs = timed_pair(
            lambda p: spec.speculative_generate(remote_target, remote_draft, p, SPEED_K, SPEED_NEW),
            lambda p: learner.build(batched_greedy, plain_target, p, SPEED_NEW), fresh[1:], clock, tally)
        for r, (prompts, (out, (target_calls, draft_calls), plain)) in enumerate(zip(fresh[1:], outs)):
            require(isinstance(out, tuple) and out and out[0] == plain == batched_greedy(target, prompts, SPEED_NEW),
                    f"{what}: timed call {r}'s tokens are not the target's greedy tokens; pass spec-greedy first")
            stats = out[1] if isinstance(out[1], dict) else {}
            drafting = sum(1 for x in stats.get("rounds") or () if isinstance(x, list) and x and x[0])
            require(target_calls >= least and draft_calls >= drafting,
                    f"{what}: timed call {r} (fresh prompts) ran the target {target_calls} and the draft "
                    f"{draft_calls} times (the course's CountedModel around each) for {drafting} reported rounds "
                    "that drafted; "
                    f"{SPEED_NEW} tokens at most {SPEED_K + 1} per round need at least {least} target passes and "
                    "a draft pass in every round. Every call computes its tokens: a result remembered from an "
                    "earlier call, or computed outside the models, is not speculation")
        speedups[batch] = t_plain / t_spec
        record(f"speed-up batch {batch}", speedups[batch], unit="x", seconds=t_spec, reference_seconds=t_plain,
               reference="the target alone, batched greedy (kit)", model=what)
        if speedups[batch] < 1 and stop == 16:
            stop = batch
    record("stops helping at batch", stop, unit="sequences")
    require(speedups[1] <= SPEED_K + 1,
            f"batch 1, k = {SPEED_K}: speculative decoding ran {speedups[1]:.2f}x as fast as the target alone, more "
            f"than the {SPEED_K + 1}x speculation can give (a round yields at most k + 1 = {SPEED_K + 1} tokens for "
            "one target pass, and the draft costs time too). Time what the call computes: the tokens of every call "
            "from its own prompts")
    require(speedups[1] >= lab_check.threshold,
            f"batch 1, k = {SPEED_K}: speculative decoding ran {speedups[1]:.2f}x as fast as the target alone, the "
            f"target is {lab_check.threshold:g}x. A round costs d draft passes plus ONE target pass; if it takes "
            "more target passes, or the draft runs more than it needs, there is nothing to gain")
