"""Serving the shared-prefix workload with and without prefix caching (kit.paged_generation: 8 requests, one
100-token system prompt + a 20-token question each, 8 new tokens, 16-token blocks, 64 blocks, one request at a
time, every request kept live): the course's model generates through your allocator and paged_attention, and the
grader measures TTFT, TPOT = (E2EL - TTFT) / (tokens - 1), E2EL P50/P95/P99 and output token throughput
(kit.loadgen.compute_metrics, vLLM's definitions) on its own clock, and the KV memory held at the end. Outputs
must equal full recomputation in both runs; cached tokens and blocks must be what the workload implies."""
import pytest
import torch

from infracourse.grader import LabCheckFailed
from infracourse.kit import intra_op, paged_generation as pg
from infracourse.kit.generate import greedy_generate
from infracourse.kit.threads import intra_op_threads


@pytest.mark.check("prefix-serving")
def test_serving_with_and_without_prefix_caching(paged, learner, seed, device, record):
    def check(caching, i, run, gen):
        what = (f"seed {seed}, prefix caching {'on' if caching else 'off'}: request {i + 1} of {pg.REQUESTS} "
                f"({pg.SYSTEM}-token system prompt + {pg.QUESTION}-token question, {pg.BLOCK}-token blocks)")
        want_cached = pg.EXPECTED_CACHED if caching and i else 0
        if run.cached != want_cached:
            raise LabCheckFailed(f"{what}: allocate returned {run.cached} cached tokens, expected {want_cached}"
                                 + ("" if caching else ": with prefix caching off nothing is ever a hit"))
        with torch.no_grad():
            want = greedy_generate(gen.model, pg.shared_prefix_prompts(seed)[i], pg.NEW)
        if run.tokens != want:
            raise LabCheckFailed(f"{what}: generated {run.tokens}, full recomputation {want}")

    # one intra-op thread on both sides: the CPU clock then counts work, not threads spinning while they wait
    learner.build(intra_op.set_intra_op_threads, 1)
    with intra_op_threads(1):
        try:
            runs = pg.serve_shared_prefix(paged, seed, learner.worker.joint_clock(device), device, check)
        except pg.InvalidAnswer as exc:
            raise LabCheckFailed(f"seed {seed}, the shared-prefix workload: {exc}") from None
    figures = {caching: pg.serving_figures(*runs[caching]) for caching in runs}
    for caching, got in figures.items():
        want = -(-(pg.SYSTEM + pg.QUESTION + pg.NEW - 1) // pg.BLOCK) * pg.REQUESTS - (
            (pg.REQUESTS - 1) * (pg.SYSTEM // pg.BLOCK) if caching else 0)
        if got["blocks"] != want:
            raise LabCheckFailed(f"seed {seed}, prefix caching {'on' if caching else 'off'}: {got['blocks']} blocks "
                                 f"in use with all {pg.REQUESTS} requests live, expected {want}")
        mode = "cached" if caching else "uncached"
        model = f"the shared-prefix workload, prefix caching {'on' if caching else 'off'}, concurrency 1"
        for key, unit in (("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"), ("tpot_p50_ms", "ms"), ("e2el_p50_ms", "ms"),
                          ("e2el_p95_ms", "ms"), ("e2el_p99_ms", "ms"), ("output_tok_s", "tok/s"),
                          ("kv_bytes", "B")):
            record(f"{key} {mode}", got[key], unit=unit, model=model)
    # what a hit saves: the prefill of the shared tokens (the calls' fixed costs cancel in the difference)
    record("ttft saved p50", figures[False]["ttft_p50_ms"] - figures[True]["ttft_p50_ms"], unit="ms",
           model="the shared-prefix workload: TTFT P50 without prefix caching minus with it")
