"""Week 16 proves its grader: the solution passes, the starter fails, each wrong variant the issue names fails
its check, and honest solutions in other styles pass: tests/fixtures/week16-honest (blocks with release
timestamps, sha256 chained keys, a per-sequence loop of index_select and SDPA) and tests/fixtures/week16-b-honest
(heaps with lazy deletion for the free pools, sequences that keep only their running hash and partial tail, a
plan-then-commit allocate, attention as a block-by-block online softmax). The last three tests check the course's
references (kit.paged_reference) without grading."""
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, handout_solution, not_passed
from reportproof import invented, reworded

FIXTURES = Path(__file__).parent / "fixtures"
SOLUTION = Path(__file__).parent.parent / "labs" / "week16-paged-kv" / "solution"


@pytest.mark.slow
def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week16")


@pytest.mark.slow
def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week16", source="starter", stamp=False)
    assert not result.complete
    assert all(c.status in ("failed", "blocked") for c in checks.values()), \
        {c.id: (c.status, c.message) for c in checks.values()}
    assert "allocate" in checks["allocator-invariants"].message
    assert "block table" in checks["paged-attention"].message
    assert "at least" in checks["engine-trace"].message


SCHEDULE_STEP = ("  - file: vllm/v1/core/sched/scheduler.py\n    function: Scheduler.schedule\n"
                 "    role: continuous batching - picks running then waiting requests within the token budget\n")


def schedule_after_the_model(trace: str) -> str:
    trace = replace_once(SCHEDULE_STEP, "")(trace)
    sampled = "    function: GPUModelRunner.sample_tokens\n    role: samples the next token of every request in the batch\n"
    return replace_once(sampled, sampled + SCHEDULE_STEP)(trace)


@pytest.mark.slow
def test_trace_failures_never_show_the_index(grade_lab):
    """A wrong file and a wrong function: the messages say what is wrong, and name no indexed file or
    definition the trace did not name itself."""
    from infracourse.kit.paged_reference import vllm_index
    index = vllm_index()
    for old, new in (("file: vllm/v1/executor/uniproc_executor.py", "file: vllm/v1/executor/uniproc.py"),
                     ("function: KVCacheManager.allocate_slots", "function: KVCacheManager.allocate_slot")):
        _, checks = grade_lab("week16", edits={"trace.yaml": replace_once(old, new)}, checks=["engine-trace"])
        message = checks["engine-trace"].message
        assert checks["engine-trace"].status == "failed", message
        named = {line.split(":", 1)[1].strip() for line in (SOLUTION / "trace.yaml").read_text().splitlines()
                 if line.strip().startswith(("file:", "- file:", "function:"))}
        leaked = [f for f in index["files"] if f in message and f not in named]
        leaked += [d for f in index["files"].values() for d in f["defs"]
                   if len(d) > 8 and d in message and d not in named and d not in new]
        assert not leaked, (leaked, message)


# paged_attention gathers each sequence's keys through its table, then returns the course's reference attention
# (kit.paged_reference, mounted for the learner to read): it passed paged-attention without attention of its own
REFERENCE_ATTENTION = replace_once(
    "    B, H, hd = q.shape\n    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]\n",
    "    from infracourse.kit.paged_reference import contiguous_attention\n"
    "    pos = [torch.arange(int(n)) for n in context_lens]\n"
    "    slots = [(block_tables[b][p // k_cache.shape[1]], p % k_cache.shape[1]) for b, p in enumerate(pos)]\n"
    "    return contiguous_attention(q, [k_cache[s].transpose(0, 1) for s in slots],\n"
    "                                [v_cache[s].transpose(0, 1) for s in slots]).to(q.dtype)\n"
    "    B, H, hd = q.shape\n    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]\n")

VARIANTS = {
    # free forgets the sequence's last block: it is neither free nor held by anyone
    "allocator that leaks on free": ("allocator-invariants", {"paged.py": replace_once(
        "for block in reversed(self.tables.pop(seq_id)):", "for block in reversed(self.tables.pop(seq_id)[:-1]):")}),
    # the same leak behind a state() rebuilt from the block tables, which looks consistent: caught when allocate
    # raises MemoryError while the judge's own count says blocks are free
    "leak hidden by a lying state()": ("allocator-invariants", {"paged.py": lambda text: replace_once(
        "for block in reversed(self.tables.pop(seq_id)):", "for block in reversed(self.tables.pop(seq_id)[:-1]):")(
        replace_once('return {"free": self.plain + list(self.evictable), "ref_counts": list(self.ref_counts),',
                     'held = [b for t in self.tables.values() for b in t]\n'
                     '        return {"free": [b for b in range(self.num_blocks) if b not in held], '
                     '"ref_counts": [held.count(b) for b in range(self.num_blocks)],')(text))}),
    # a new block is taken without leaving the free list: two sequences can end up owning it
    "double allocation": ("allocator-invariants", {"paged.py": replace_once(
        "block = self.plain.pop()", "block = self.plain[-1]")}),
    "prefix hash that ignores the previous block": ("prefix-cache", {"paged.py": replace_once(
        "prev = hash((prev, tuple(token_ids[i * bs:(i + 1) * bs])))", "prev = hash(tuple(token_ids[i * bs:(i + 1) * bs]))")}),
    # evicts the unreferenced block cached first (block_hash keeps the order of caching), whatever its last use
    "FIFO eviction instead of LRU": ("prefix-cache", {"paged.py": replace_once(
        "block, _ = self.evictable.popitem(last=False)",
        "block = next(b for b in self.block_hash if b in self.evictable)\n            del self.evictable[block]")}),
    # caches whatever the switch says: serving with prefix caching off still reports hits
    "prefix caching that ignores its switch": ("prefix-serving", {"paged.py": replace_once(
        "self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching",
        "self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, True")}),
    "invented KV bytes in the report": ("report", {"report.md": invented("kv_bytes_uncached", 1.5)}),
    # refused by the judge's reading of paged.py before any comparison
    "attention that returns the course's reference": ("paged-attention", {"paged.py": REFERENCE_ATTENTION}),
    "attention that reads one slot past the end": ("paged-attention", {"paged.py": replace_once(
        "valid = pos[None, :] < context_lens[:, None]", "valid = pos[None, :] <= context_lens[:, None]")}),
    "invented cached-token figure in the report": ("report", {"report.md": invented("cached_tokens", 1.5)}),
    "trace naming a function the file does not define": ("engine-trace", {"trace.yaml": replace_once(
        "function: KVCacheManager.allocate_slots", "function: KVCacheManager.allocate_blocks")}),
    # every step real, but the scheduler's step listed after the model has run
    "trace with the scheduler after the model": ("engine-trace", {"trace.yaml": schedule_after_the_model}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edits = VARIANTS[name]
    check = assert_variant_fails(grade_lab, "week16", check_id, edits)
    assert REASON.get(name, "") in check.message, check.message


# what a variant's message must say
REASON = {"attention that returns the course's reference": "contiguous_attention, the grader's reference"}


@pytest.mark.slow
def test_report_in_other_words_passes(grade_lab):
    _, checks = grade_lab("week16", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["week16-honest", "week16-b-honest"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, folder):
    edits = {p.name: p.read_text() for p in (FIXTURES / folder).iterdir() if p.is_file()}
    assert_solution_passes(grade_lab, machine, "week16", edits=edits)


# --- the course's references (infracourse.kit.paged_reference), without a grade -----------------------------
def test_vllm_index_covers_every_stage_of_the_request_path():
    from infracourse.kit.paged_reference import REQUIRED_STAGES, vllm_index
    index = vllm_index()
    assert index["version"] == "0.34.0" and index["commit"]
    assert set(REQUIRED_STAGES) <= {f["stage"] for f in index["files"].values()}
    assert all(f["defs"] for f in index["files"].values())
    assert "Scheduler.schedule" in index["files"]["vllm/v1/core/sched/scheduler.py"]["defs"]


def test_contiguous_attention_is_sdpa_with_grouped_heads():
    import torch
    import torch.nn.functional as F
    from infracourse.kit.paged_reference import contiguous_attention
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, generator=g)
    keys = [torch.randn(2, n, 8, generator=g) for n in (3, 7)]
    values = [torch.randn(2, n, 8, generator=g) for n in (3, 7)]
    out = contiguous_attention(q, keys, values)
    for b in range(2):
        want = F.scaled_dot_product_attention(q[b, :, None], keys[b].repeat_interleave(2, 0),
                                              values[b].repeat_interleave(2, 0))[:, 0]
        torch.testing.assert_close(out[b], want)


def test_state_violations_name_each_broken_invariant():
    from infracourse.kit.paged_reference import state_violations
    ok = {"free": [2, 3], "ref_counts": [1, 2, 0, 0], "block_tables": {"a": [0, 1], "b": [1]}}
    assert state_violations(ok, 4, shared_allowed=True) == []
    assert "without prefix caching" in " ".join(state_violations(ok, 4, shared_allowed=False))
    leak = {"free": [3], "ref_counts": [1, 1, 0, 0], "block_tables": {"a": [0, 1]}}
    assert "(leaked): [2]" in " ".join(state_violations(leak, 4, shared_allowed=False))
    lie = {"free": [2, 3], "ref_counts": [1, 1, 0, 0], "block_tables": {"a": [0, 1], "b": [1]}}
    assert "block 1 has reference count 1 but 2" in " ".join(state_violations(lie, 4, shared_allowed=True))


def test_gpu_pool_bytes_must_be_the_devices(monkeypatch):
    """week16_judging.check_pool_bytes, gpu-paged's memory verdict, fed figures on a CPU: the device allocator's
    figure for the pool passes within its 512-byte rounding; a pool in host memory (no device figure) or a figure
    of another size fails."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "graders" / "week16"))
    from week16_judging import check_pool_bytes
    from infracourse.failures import LabCheckFailed
    formula = 2 * 4 * 256 * 16 * 2 * 64 * 4
    check_pool_bytes(formula, formula, 8, "w")
    check_pool_bytes(formula + 8 * 512, formula, 8, "w")
    for device_bytes, expected in ((None, "host memory"), (formula // 2, "not of the same pool"),
                                   (formula + 2**20, "not of the same pool")):
        with pytest.raises(LabCheckFailed, match=expected):
            check_pool_bytes(device_bytes, formula, 8, "w")


def _solution_paged():
    """The reference's paged.py, imported here (course code runs beside it; nothing is graded)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "paged_solution", Path(__file__).parent.parent / "labs" / "week16-paged-kv" / "solution" / "paged.py")
    paged = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paged)
    return paged


def test_paged_generation_keeps_its_pool_where_the_model_runs():
    """kit.paged_generation: on a CPU the pool is host memory and says so (pool_device_bytes None); the model and
    the pool share one device, and generation through the solution equals full recomputation there."""
    import torch
    from infracourse.kit.generate import greedy_generate
    from infracourse.kit.gpt import GPTConfig
    from infracourse.kit.paged_generation import PagedGeneration
    paged = _solution_paged()
    cfg = GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_head=4, n_kv_head=2, n_layer=2)
    gen = PagedGeneration(paged, seed=3, blocks=16, block_size=4, prefix_caching=True, cfg=cfg)
    assert gen.pool_device_bytes is None
    assert {t.device for t in (*gen.k_caches, *gen.v_caches, *gen.model.parameters())} == {torch.device("cpu")}
    prompt = list(range(5, 18))
    assert gen.generate("a", prompt, 5).tokens == greedy_generate(gen.model, prompt, 5)


def test_a_prompt_cached_whole_still_generates_right():
    """Rule 3 of the handout: every matching full block counts, so a prompt of whole blocks seen before comes back
    with its full length cached. The course's generation loop runs its last token again for the logits (writing
    nothing into the shared block) and its tokens equal full recomputation."""
    from infracourse.kit.generate import greedy_generate
    from infracourse.kit.gpt import GPTConfig
    from infracourse.kit.paged_generation import PagedGeneration
    paged = _solution_paged()
    cfg = GPTConfig(vocab_size=256, seq_len=64, d_model=32, n_head=4, n_kv_head=2, n_layer=2)
    gen = PagedGeneration(paged, seed=3, blocks=16, block_size=4, prefix_caching=True, cfg=cfg)
    prompt = list(range(5, 17))  # three whole blocks of 4
    first = gen.generate("a", prompt, 5)
    blocks = gen.allocator.block_table("a")[:3]
    before = [cache[blocks].clone() for cache in (*gen.k_caches, *gen.v_caches)]
    again = gen.generate("b", prompt, 5)
    assert gen.allocator.block_table("b")[:3] == blocks  # shared, not copied
    assert gen.allocator.allocate("c", prompt) == len(prompt)  # every block counts as cached
    assert first.tokens == again.tokens == greedy_generate(gen.model, prompt, 5)
    after = [cache[blocks] for cache in (*gen.k_caches, *gen.v_caches)]
    assert all(b.equal(a) for b, a in zip(before, after))  # the shared blocks were not written again


@pytest.mark.slow
@pytest.mark.solutions  # a learner release leaves the handout solutions out
def test_solution_written_from_the_handout_alone_passes(grade_lab, machine):
    """paged.py and trace.yaml (and its report, from the starter's bench.py on that paged.py): by someone who read only
    the handout, the starter, lab.yaml and the kit modules it names (tests/fixtures/week16-handout), never the
    reference or the graders."""
    assert_solution_passes(grade_lab, machine, "week16", edits=handout_solution("week16"))
