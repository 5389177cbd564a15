"""What the cache saves, counted where the judge controls it: the model the learner's generate runs (built in the
worker) is wrapped by the course (kit.generate.count_work), which logs every forward pass's entry (model.embed:
tokens embedded, position offset). Cached generation runs the prompt once, in one pass, then one token per step
at the next position; recomputing the sequence, or feeding the prompt one token at a time, gives the same tokens
and shows here. The log is kept in the learner's process: it can fail this check, never pass one alone (the
outputs are checked against the judge's recomputation)."""
import random

import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.generate import count_work, seeded_prompts, work_done
from week15_judging import call_generate, follows_greedy, models, seeded_config


def expected_work(prompt_len: int, n: int) -> list[tuple[int, int]]:
    """The forward passes cached generation makes: the prompt at position 0, then each new token but the last
    at its own position (feeding the last one back too is accepted)."""
    return [(prompt_len, 0)] + [(1, prompt_len + i) for i in range(n - 1)]


@pytest.mark.check("cache-work")
def test_each_token_runs_through_the_model_once(kv, learner, seed):
    cfg = seeded_config(seed + 1)
    local, remote = models(learner, cfg, seed + 1)
    learner.build(count_work, remote)
    r = random.Random(seed + 1)
    for prompt in seeded_prompts(2, cfg.vocab_size, 12, 30, seed=seed + 1):
        n = r.randint(6, 16)
        what = f"generate(model, a prompt of {len(prompt)} tokens, {n})"
        learner.build(work_done, remote)  # the log starts empty
        tokens, _, _ = call_generate(kv, remote, prompt, n, what)
        work = [tuple(w) for w in learner.build(work_done, remote)]
        if not follows_greedy(local, prompt, tokens):
            raise LabCheckFailed(f"{what}: the tokens differ from full recomputation's; pass cached-tokens first")
        expected = expected_work(len(prompt), n)
        allowed = (expected, expected + [(1, len(prompt) + n - 1)])
        if work in allowed:
            continue
        ran = sum(t for t, _ in work)
        if not work or work[0] != expected[0]:
            first = f"{work[0][0]} token(s) at position {work[0][1]}" if work else "nothing"
            raise LabCheckFailed(
                f"{what}: the model's first forward pass ran {first}; prefill runs the whole prompt ({len(prompt)} "
                f"tokens from position 0) in ONE pass into the fresh cache (your {len(work)} passes embedded {ran} "
                "tokens in all). One token at a time gives the same cache at the cost of a pass per prompt token")
        i = next((i for i, (w, e) in enumerate(zip(work, expected)) if w != e), len(expected))
        got = f"{work[i][0]} token(s) at position {work[i][1]}" if i < len(work) else "no pass"
        need = f"1 token at position {expected[i][1]}" if i < len(expected) else "no further pass"
        raise LabCheckFailed(
            f"{what}: decode step {i} (forward pass {i + 1}) ran {got}, cached generation runs {need} "
            f"({len(work)} passes, {ran} tokens embedded in all; the cache allows {len(expected)} passes and "
            f"{len(prompt) + n - 1} tokens). A decode step runs only the new token through the model, its keys and "
            "values appended to the cache; running the sequence again recomputes what the cache holds")
