"""Week 15 proves its grader: the solution passes, the starter fails, each wrong variant the issue names fails
its check, and an honest solution in another style (a cache grown with torch.cat, tests/fixtures/week15-honest)
passes."""
from pathlib import Path

import pytest
import torch

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails
from reportproof import invented, reworded

pytestmark = pytest.mark.slow

HONEST = Path(__file__).parent / "fixtures" / "week15-honest"


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week15")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week15", source="starter", stamp=False)
    assert not result.complete
    assert all(c.status == "failed" for c in checks.values()), {c.id: (c.status, c.message) for c in checks.values()}
    assert "prefill the prompt" in checks["cached-tokens"].message
    assert "from the configuration" in checks["kv-bytes-formula"].message


# each decode step runs the whole sequence again into a fresh cache: right tokens, no saving
RERUN = replace_once(
    "logits = forward(model, torch.tensor([[token]], device=device), cache)  # decode",
    "ids = torch.cat([ids, torch.tensor([[token]], device=device)], 1)\n"
    "            cache = KVCache(model.cfg, ids.shape[1] + max_new_tokens, dtype, device)\n"
    "            logits = forward(model, ids, cache)")

VARIANTS = {
    # decode embeds every new token at position 0
    "cache that forgets the position offset": ("cached-tokens", {"kv_cache.py": replace_once(
        "x = model.embed(ids, cache.length)", "x = model.embed(ids, 0 if ids.shape[1] == 1 else cache.length)")}),
    "cache that re-runs the full sequence": ("decode-speedup", {"kv_cache.py": RERUN}),
    # the same, seen where the judge counts the work
    "cache that re-runs the full sequence (counted)": ("cache-work", {"kv_cache.py": RERUN}),
    # prefill fed one prompt token at a time: the same cache and tokens, a forward pass per prompt token
    "prompt prefilled one token at a time": ("cache-work", {"kv_cache.py": replace_once(
        "logits = forward(model, ids, cache)  # prefill",
        "for i in range(ids.shape[1]):  # prefill\n"
        "        logits = forward(model, ids[:, i:i + 1], cache)")}),
    # reads the GPT's own embeddings instead of model.embed: right on the GPT, cannot serve a checkpoint
    "cache bound to the GPT's attributes": ("checkpoint-tokens", {"kv_cache.py": replace_once(
        "x = model.embed(ids, cache.length)", "x = model.tok_emb(ids) + model.pos_emb(torch.arange(cache.length, "
        "cache.length + ids.shape[1], device=ids.device))")}),
    "kv_bytes that ignores grouped KV heads": ("kv-bytes-formula", {"kv_cache.py": replace_once(
        "2 * config.n_layer * config.kv_heads * config.head_dim",
        "2 * config.n_layer * config.n_head * config.head_dim")}),
    "invented decode time in the report": ("report", {"report.md": invented("decode_ms_per_token", 100.0)}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edits = VARIANTS[name]
    assert_variant_fails(grade_lab, "week15", check_id, edits)


def test_report_in_other_words_passes(grade_lab):
    _, checks = grade_lab("week15", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", checks["report"].message


def test_honest_solution_in_another_style_passes(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week15",
                           edits={"kv_cache.py": (HONEST / "kv_cache.py").read_text()})


def test_count_work_logs_each_forward_pass():
    """kit.generate.count_work: every model.embed call (the GPT's own forward included) is logged as (tokens,
    offset), and work_done reads and empties the log; wrapping twice counts once."""
    from infracourse.kit.generate import count_work, greedy_generate, work_done
    from infracourse.kit.gpt import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=256, seq_len=32, d_model=16, n_head=2, n_layer=1), seed=0).eval()
    count_work(model)
    count_work(model)
    greedy_generate(model, [3, 4, 5], 3)              # full recomputation: the whole sequence every step
    assert work_done(model) == [(3, 0), (4, 0), (5, 0)]
    model.embed(torch.tensor([[7]]), pos_offset=5)
    model.embed(torch.tensor([[7, 8]]), 6)
    assert work_done(model) == [(1, 5), (2, 6)] and work_done(model) == []
