"""Week 15 proves its grader: the solution passes, the starter fails, each wrong variant the issue names fails
its check, and honest solutions in two other styles pass: tests/fixtures/week15-honest (a cache grown with
torch.cat) and tests/fixtures/week15-b-honest (one slab for every layer's K and V filled with index_copy_, the
model run as a coroutine, tokens and logits written into preallocated tensors)."""
from pathlib import Path

import pytest
import torch

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, handout_solution, not_passed
from reportproof import invented, reworded

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week15")


def test_starter_fails_and_says_what_to_do(grade_lab, machine):
    result, checks = grade_lab("week15", source="starter", stamp=False)
    assert not result.complete
    # gpu-serving is blocked on a machine without CUDA (it fails there only on a GPU); every other check fails
    assert all(c.status == "failed" or (c.status == "blocked" and c.id == "gpu-serving" and not machine.gpu_count)
               for c in checks.values()), {c.id: (c.status, c.message) for c in checks.values()}
    assert "prefill the prompt" in checks["cached-tokens"].message
    assert "from the configuration" in checks["kv-bytes-formula"].message


# each decode step runs the whole sequence again into a fresh cache: right tokens, no saving
RERUN = replace_once(
    "logits = forward(model, nxt[:, None], cache)  # decode",
    "ids = torch.cat([ids, nxt[:, None]], 1)\n"
    "            cache = KVCache(model.cfg, ids.shape[1] + max_new_tokens, dtype, device, batch=ids.shape[0])\n"
    "            logits = forward(model, ids, cache)")

# grouped-query attention treated as multi-head: a cache of n_head heads, each KV head repeated to fill it
# (tiled: query head h meets KV head h % kv_heads, where the model groups h // (n_head / kv_heads))
AS_MHA = {"kv_cache.py": lambda text: replace_once(
    "shape = (batch, cfg.kv_heads, capacity, cfg.head_dim)", "shape = (batch, cfg.n_head, capacity, cfg.head_dim)")(
    replace_once("        q, k, v = block.attn.qkv_heads(block.norm1(x))\n",
                 "        q, k, v = block.attn.qkv_heads(block.norm1(x))\n"
                 "        k, v = (t.repeat(1, model.cfg.n_head // t.shape[1], 1, 1) for t in (k, v))\n")(text))}

# the course's own cache and cached forward (kit.llama, mounted to load the checkpoint) run on the kit GPT, whose
# pieces are the same: it passed cached-tokens, cache-work, checkpoint-tokens and cache-bytes without a cache
# of its own
COURSE_LLAMA_CACHE = '''from __future__ import annotations

import types

import torch

from infracourse.kit.llama import KVCache as CourseCache, Llama


class KVCache:
    def __init__(self, cfg, capacity: int, dtype: torch.dtype, device, batch: int = 1):
        layers = getattr(cfg, "n_layer", None) or cfg.layers
        shape = types.SimpleNamespace(layers=layers, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                                      max_positions=capacity)
        self.inner = CourseCache(shape, batch, capacity, device=device, dtype=dtype)

    @property
    def length(self) -> int:
        return self.inner.length

    def tensors(self) -> list[torch.Tensor]:
        n = self.inner.length
        return [t[:, :, :n] for pair in zip(self.inner.k, self.inner.v) for t in pair]


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens: int):
    p = next(model.parameters())
    batched = bool(prompt_ids) and isinstance(prompt_ids[0], (list, tuple))
    ids = torch.tensor([list(x) for x in prompt_ids] if batched else [list(prompt_ids)], device=p.device)
    cache = KVCache(model.cfg, ids.shape[1] + max_new_tokens, p.dtype, p.device, batch=ids.shape[0])
    logits = Llama.forward(model, ids, cache.inner)[:, -1]
    steps, rows = [], []
    for step in range(max_new_tokens):
        nxt = logits.float().argmax(-1)
        steps.append(nxt.tolist())
        rows.append(logits.float())
        if step + 1 < max_new_tokens:
            logits = Llama.forward(model, nxt[:, None], cache.inner)[:, -1]
    tokens = [list(s) for s in zip(*steps)]
    if not batched:
        return tokens[0], torch.stack(rows)[:, 0], cache
    return tokens, torch.stack(rows, dim=1), cache


def kv_bytes(config, tokens: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layer * config.kv_heads * config.head_dim * tokens * element
'''

VARIANTS = {
    # the judge's reading of kv_cache.py refuses the import before any comparison
    "cache borrowed from kit.llama": ("cached-tokens", {"kv_cache.py": COURSE_LLAMA_CACHE}),
    # generate returns the judge's reference itself (kit.generate.greedy_generate): cached-tokens and
    # checkpoint-tokens pass, the counted forward passes show the recomputation
    "generate that is the kit's full recomputation": ("cache-work", {"kv_cache.py": replace_once(
        "def generate(model, prompt_ids, max_new_tokens: int):\n",
        "def generate(model, prompt_ids, max_new_tokens: int):\n"
        "    from infracourse.kit.generate import greedy_generate\n"
        "    if not (prompt_ids and isinstance(prompt_ids[0], (list, tuple))):\n"
        "        tokens, logits = greedy_generate(model, prompt_ids, max_new_tokens, return_logits=True)\n"
        "        return tokens, logits, KVCache(model.cfg, 1, torch.float32, 'cpu')\n")}),
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
    # the loader's num_key_value_heads ignored on the cache's side: GQA served as MHA
    "cache that treats grouped KV heads as one per query head": ("checkpoint-tokens", AS_MHA),
    # a batch decoded with the first sequence's token fed to every row: batch 1 right, a batch wrong
    "batch decoded with one sequence's tokens": ("phase-times", {"kv_cache.py": replace_once(
        "logits = forward(model, nxt[:, None], cache)  # decode",
        "logits = forward(model, nxt[:1, None].expand(len(nxt), 1), cache)  # decode")}),
    # batch 1 only: a list of prompts read as one long prompt
    "generate that cannot take a batch": ("phase-times", {"kv_cache.py": replace_once(
        "batched = bool(prompt_ids) and isinstance(prompt_ids[0], (list, tuple))", "batched = False")}),
}


# what a variant's message must say
REASON = {"cache borrowed from kit.llama": "reaches infracourse.kit.llama, the grader's reference",
          "generate that is the kit's full recomputation": "running the sequence again recomputes what the cache holds"}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edits = VARIANTS[name]
    check = assert_variant_fails(grade_lab, "week15", check_id, edits)
    assert REASON.get(name, "") in check.message, check.message


def test_report_in_other_words_passes(grade_lab):
    _, checks = grade_lab("week15", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


@pytest.mark.parametrize("folder", ["week15-honest", "week15-b-honest"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, folder):
    edits = {p.name: p.read_text() for p in (FIXTURES / folder).iterdir() if p.is_file()}
    assert_solution_passes(grade_lab, machine, "week15", edits=edits)


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


def test_gpu_serving_memory_figures_must_be_the_devices(monkeypatch):
    """week15_judging.check_device_memory, the verdict of gpu-serving's memory, fed figures on a CPU: the device's
    own figures pass; a figure from the host (RSS), a cache kept in host memory (the device holds nothing more
    after the call) and allocator figures the judge's reading of the device does not show each fail."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "graders" / "week15"))
    from week15_judging import check_device_memory
    from infracourse.failures import LabCheckFailed
    weights, kv = 2_000_000_000, 545_000_000
    honest = dict(before=weights + 10_000, held=weights + 10_000 + kv + 4096, peak=weights + kv + 900_000_000,
                  device_delta=kv + 1_200_000_000, kv_formula=kv, weights=weights, source="device", what="w")
    check_device_memory(**honest)
    cases = {"host memory": dict(source="the process's RSS (psutil)"),
             "Keep the cache on the model's device": dict(held=weights + 10_000 + 1_000_000),  # in host memory
             "weights are not on the device": dict(before=10_000, held=10_000 + kv, peak=kv + 20_000),
             "not a figure of this call": dict(peak=weights + 10_000),
             "the figures are not the device's": dict(device_delta=1_000_000)}                    # the judge sees nothing taken
    for expected, change in cases.items():
        with pytest.raises(LabCheckFailed, match=expected):
            check_device_memory(**{**honest, **change})


def test_roofline_turns_compute_bound_where_the_formulas_meet():
    """kit.llama_serving.roofline: intensity = FLOPs / bytes of a decode step; the crossover batch is the first
    whose intensity reaches the ridge point (none when a sequence's KV reads cost more than its FLOPs buy)."""
    from infracourse.kit.hf_checkpoint import LlamaConfig
    from infracourse.kit.llama_serving import decode_bytes, decode_flops, roofline
    cfg = LlamaConfig(layers=8, hidden=3072, heads=24, kv_heads=8, vocab=32000, intermediate=8192,
                      max_positions=2048, dtype="bfloat16")
    short = roofline(cfg, 1, 136, torch.bfloat16, copy_gbps=3000, tflops=700)
    assert short["bound"] == "memory" and short["ridge"] == pytest.approx(700e12 / 3000e9)
    b = short["crossover_batch"]
    below, at = (roofline(cfg, n, 136, torch.bfloat16, copy_gbps=3000, tflops=700) for n in (b - 1, b))
    assert below["intensity"] < short["ridge"] <= at["intensity"] and at["bound"] == "compute"
    assert at["intensity"] == decode_flops(cfg, b, 136) / decode_bytes(cfg, b, 136, torch.bfloat16)
    assert roofline(cfg, 16, 1032, torch.bfloat16, copy_gbps=3000, tflops=700)["crossover_batch"] is None


@pytest.mark.slow
@pytest.mark.solutions  # a learner release leaves the handout solutions out
def test_solution_written_from_the_handout_alone_passes(grade_lab, machine):
    """kv_cache.py and measure.py (and its report, from its own measure.py): by someone who read only the handout, the
    starter, lab.yaml and the kit modules it names (tests/fixtures/week15-handout), never the reference or the
    graders."""
    assert_solution_passes(grade_lab, machine, "week15", edits=handout_solution("week15"))
