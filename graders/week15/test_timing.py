"""Prefill and decode timed by the judge's clock, and the cached decode against the kit's full recomputation.

The workload is fixed (conftest.TIMING_*: a 384-token prompt, 16 new tokens, batch 1, fp32, one intra-op
thread, cache cold: built fresh by each call). The judge's clock (on a CPU the worker's CPU seconds, read
from the kernel; on a GPU the wall clock) runs around calls into the worker:
  prefill_ms           fastest of five timings of generate(model, prompt, 1): the prompt's forward pass and
                       the first token (what a server's TTFT would add queueing and transport to)
  decode_ms_per_token  (fastest timing of generate(model, prompt, 16) - prefill) / 15: each further token
The same two timings of the kit's greedy_generate (every step recomputes the whole sequence), in the same
worker, give the uncached time per token; the cached decode must beat it by lab.yaml's threshold. Every timed
call gets a fresh seeded prompt and its tokens are checked against full recomputation here; the slope between
8 and 16 new tokens is also taken, and the slower of the two slopes is the one compared. A prefill faster than
PREFILL_FLOOR of the kit's own forward pass over a prompt of the same length is not a prefill, and fails.
"""

import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit import generate
from infracourse.kit.generate import greedy_generate, seeded_prompts
from week15_judging import TIMING_CFG, TIMING_NEW, TIMING_PROMPT, call_generate, follows_greedy, models

REPEATS = 5
# A prefill runs every prompt token through every layer: it takes at least this share of the kit's one forward
# pass over the same prompt (which also computes logits at every position). Less is a prompt not computed.
PREFILL_FLOOR = 0.3


def _fastest(fn, repeats, clock):
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)  # the fastest call: the least disturbed by other work on the machine


MID = 8  # a third length: the decode slope is also taken between MID and TIMING_NEW tokens


@pytest.mark.check("decode-speedup")
def test_cached_decode_is_faster(kv, learner, record, lab_check, seed, device):
    local, remote = models(learner, TIMING_CFG, 0)
    # fresh prompts for every timed call (a result remembered from an earlier call is no faster decoding)
    prompts = iter(seeded_prompts(3 * REPEATS + 1, TIMING_CFG.vocab_size, TIMING_PROMPT, TIMING_PROMPT, seed=seed))
    what = f"a {TIMING_PROMPT}-token prompt, {TIMING_NEW} new tokens, batch 1, fp32"
    warm = next(prompts)
    got, _, _ = call_generate(kv, remote, warm, TIMING_NEW, what)  # also the warm-up
    if got != greedy_generate(local, warm, TIMING_NEW):
        raise LabCheckFailed(f"{what}: your tokens differ from full recomputation's; pass cached-tokens first")

    clock = learner.worker.clock(device)  # on a CPU the worker's CPU seconds: load does not stretch them

    def timed_learner(n):
        times = []
        for _ in range(REPEATS):
            prompt = next(prompts)
            t0 = clock()
            out = kv.generate(remote, prompt, n)
            times.append(clock() - t0)
            tokens = out[0] if isinstance(out, tuple) and out else None
            if not follows_greedy(local, prompt, tokens):  # every timed call's output checked
                raise LabCheckFailed(f"{what}: a timed call generate(model, prompt, {n}) returned other tokens than "
                                     "full recomputation on that prompt")
        return min(times)  # the fastest call: the least disturbed by other work on the machine

    def reference(n):
        return learner.build(generate.greedy_generate, remote, warm, n)

    reference(2)  # warm-up
    ttft, mid, total = timed_learner(1), timed_learner(MID), timed_learner(TIMING_NEW)
    ref_ttft = _fastest(lambda: reference(1), 3, clock)
    ref_total = _fastest(lambda: reference(TIMING_NEW), 3, clock)
    per_token = (total - ttft) / (TIMING_NEW - 1)
    # the slower of the two slopes is compared: a call made slow only when it generates one token cannot help
    slope = max(per_token, (total - mid) / (TIMING_NEW - MID))
    ref_per_token = (ref_total - ref_ttft) / (TIMING_NEW - 1)
    if per_token <= 0 or ref_per_token <= 0:
        raise LabCheckFailed(f"{what}: {TIMING_NEW} tokens took no longer than one ({total * 1e3:.2f} ms against "
                             f"{ttft * 1e3:.2f} ms): the machine is too loaded to time; grade again when it is idle")
    if ttft < PREFILL_FLOOR * ref_ttft:
        raise LabCheckFailed(
            f"{what}: generate(model, prompt, 1) took {ttft * 1e3:.2f} ms, less than {PREFILL_FLOOR:g}x the kit's one "
            f"forward pass over a prompt of the same length ({ref_ttft * 1e3:.2f} ms): a prefill computes every "
            "prompt token's keys and values in every layer, on each call's own (fresh) prompt; nothing from an "
            "earlier call can stand in for it")
    record("prefill", ttft * 1e3, unit="ms", seconds=ttft, model=what)
    record("decode per token", per_token * 1e3, unit="ms", seconds=per_token, model=what)
    speedup = ref_per_token / slope
    record("decode speed-up", speedup, target=lab_check.threshold, unit="x", seconds=slope,
           reference_seconds=ref_per_token, reference="full recomputation (kit greedy_generate)")
    if speedup < lab_check.threshold:
        raise LabCheckFailed(
            f"{what}: your decode takes {slope * 1e3:.2f} ms per token, full recomputation "
            f"{ref_per_token * 1e3:.2f} ms: {speedup:.2f}x, the target is {lab_check.threshold:g}x. A decode step "
            "with a cache runs ONE new token through the model (its keys and values appended, attention over the "
            "cache); running the whole sequence again each step is what the cache is there to avoid")
