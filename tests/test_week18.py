"""Week 18 proves its grader: the solution passes, the starter fails, each wrong variant the issue names fails
its check, and honest solutions in other styles pass: tests/fixtures/week18-honest (scales applied after the
matmul, a speculative decoder that always drafts k and trims, an engine that cancels queued requests lazily) and
tests/fixtures/week18-b-honest (float64 quantisation by the row's inverse step, dequantisation in bounded row
blocks, a quantize_model that swaps the Linears in through deepcopy's memo; a decoder that writes into one
preallocated token buffer and finds the batch's accepted prefix column-wise; an engine with an OrderedDict queue
and a heap of deadlines expired eagerly). The served checks run the lab's server.py (uvicorn in the sandbox,
grading.serving) over each engine. quant-serving's load matrix is timed by the judge: a slower Int8Linear moves
the int8 figures only."""
from pathlib import Path

import pytest
import torch

from conftest import replace_once
from labproof import assert_solution_passes, handout_solution, not_passed
from reportproof import invented, reworded

FIXTURES = Path(__file__).parent / "fixtures"


# ------------------------------------------------------------------ the kit pieces the judge relies on (fast)
def test_draft_agrees_often_with_the_target_and_replay_recounts():
    from infracourse.kit.generate import seeded_prompts
    from infracourse.kit.speculative import batched_greedy, draft_model, replay, target_model

    target, draft = target_model(0), draft_model(0)
    prompt = seeded_prompts(1, 256, 12, 12, seed=3)
    truth = batched_greedy(target, prompt, 24)[0]
    assert len(set(truth)) > 5, "the target's greedy text must not be one repeated token"
    ids = torch.tensor([prompt[0] + truth])
    with torch.no_grad():  # next-token guesses on the target's own text: the draft must agree often, not always
        agree = (target(ids).argmax(-1) == draft(ids).argmax(-1))[0, 11:].float().mean().item()
    assert 0.5 < agree < 0.95, agree
    # one token per round, no draft: every round accepts 0 of 0
    assert replay(target, draft, prompt, 24, [[0, 0]] * 24) == ([0] * 24, None)
    found, problem = replay(target, draft, prompt, 24, [[0, 0]] * 23)
    assert problem and "too short" in problem


def test_quant_reference_error_and_bytes():
    from infracourse.kit import quant_eval
    from infracourse.kit.speculative import target_model

    w = torch.randn(8, 16)
    w[2] = 0
    w[5, 1] = 50.0
    q, s = quant_eval.quantize_per_channel(w)
    assert q.dtype == torch.int8 and s.shape == (8,) and s[2] == 0
    assert bool(((w - q.float() * s[:, None]).abs() <= s[:, None] / 2 + 1e-6).all())
    model = target_model(0)
    state = quant_eval.state_tensors(model)
    assert quant_eval.unique_bytes(state.values()) < sum(t.nbytes for t in state.values())  # tied head once


def test_block_pool_refuses_double_free_and_overdraw():
    from infracourse.kit.block_pool import BlockPool

    pool = BlockPool(4, 2)
    blocks = pool.allocate(3)
    with pytest.raises(MemoryError):
        pool.allocate(2)
    pool.free(blocks)
    with pytest.raises(ValueError):
        pool.free(blocks[:1])
    assert pool.num_free == 4 and pool.blocks_for(5) == 3


def test_step_engine_stamps_each_token_on_the_drivers_clock(tmp_path):
    """kit.quant_serving.StepEngine serves one request at a time, one call a token, each chunk stamped when its call
    returns: a server's time shows in TTFT and TPOT, the second of two users waits for the first's whole request,
    the records hold the tokens, and kit.load_matrix recomputes every figure from them."""
    import time

    from infracourse.kit.load_matrix import check_matrix, load_matrix, run_matrix
    from infracourse.kit.loadgen import read_records
    from infracourse.kit.quant_serving import StepEngine

    def prefill(ids, max_tokens):
        time.sleep(0.006)
        return len(ids)

    def decode(token):
        time.sleep(0.003)
        return token + 1

    cells = load_matrix(input_lens=[8], output_lens=[5], concurrencies=[1, 2], requests=2)
    rows = run_matrix(cells, tmp_path, send=StepEngine(prefill, decode).send)
    assert check_matrix(tmp_path, cells) == []
    one = rows[0]["metrics"]
    assert one["ttft_ms"]["p50"] >= 6 and one["tpot_ms"]["p50"] >= 3
    assert one["e2el_ms"]["p50"] >= 6 + 4 * 3
    # two users, one server: the second request's first token comes after the first request's last one (the
    # order of the chunks' own stamps, which a loaded machine cannot reorder; comparing cells' times could)
    first, second = sorted(read_records(tmp_path / f"{cells[1].name}.json")[0], key=lambda r: r.chunk_times[0])
    assert second.chunk_times[0] >= first.chunk_times[-1]
    records, _, _ = read_records(tmp_path / f"{cells[0].name}.json")
    assert [r.text.split() for r in records] == [["8", "9", "10", "11", "12"]] * 2


def test_step_server_gives_the_greedy_tokens():
    from infracourse.kit.llama import checkpoint_model, generate
    from infracourse.kit.quant_serving import StepServer

    model = checkpoint_model({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 128, "intermediate": 128,
                              "max_positions": 64}, 0)
    server, prompt = StepServer(model), list(range(3, 13))
    tokens = [server.prefill(prompt, 5)]
    for _ in range(4):
        tokens.append(server.decode(tokens[-1]))
    assert tokens == generate(model, torch.tensor([prompt]), 5)[0].tolist()
    with pytest.raises(RuntimeError, match="last token"):
        server.decode(tokens[-1])


# ------------------------------------------------------------------ grading proofs (slow)
@pytest.mark.slow
def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week18")


@pytest.mark.slow
def test_starter_fails_and_says_what_to_do(grade_lab, machine):
    result, checks = grade_lab("week18", source="starter", stamp=False)
    assert not result.complete
    # gpu-quant-serving is blocked on a machine without CUDA; every other check fails
    assert all(c.status == "failed" or (c.status == "blocked" and c.id == "gpu-quant-serving" and not machine.gpu_count)
               for c in checks.values()), {c.id: (c.status, c.message) for c in checks.values()}
    assert "one scale per output channel" in checks["quant-error"].message
    assert "refuse a request" in checks["overload"].message
    assert "deadline" in checks["deadline"].message


SPEC, QUANT, ENGINE = "speculative.py", "quant.py", "engine.py"


def memoised(source: str) -> str:
    """speculative_generate that keeps every result and answers a repeated call from it: right tokens, right
    rounds, no model run."""
    source = replace_once("import torch\n", "import torch\n\n_MEMO = {}\n")(source)
    source = replace_once(
        "    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long)",
        "    key = (repr(prompts), k, n)\n    if key in _MEMO:\n        return _MEMO[key]\n"
        "    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long)")(source)
    return replace_once(
        '    return ids[:, start:].tolist(), {"rounds": rounds, "acceptance_rate": rate}',
        '    _MEMO[key] = ids[:, start:].tolist(), {"rounds": rounds, "acceptance_rate": rate}\n'
        '    return _MEMO[key]')(source)


def deadline_from_first_step(source: str) -> str:
    """The engine's deadline clock starts at the first step() that sees the request, not at its submit."""
    source = replace_once(
        "        deadline = None if deadline_s is None else time.monotonic() + deadline_s\n"
        "        self.queue.append(Request(rid, list(prompt), max_tokens, deadline))",
        "        self.queue.append(Request(rid, list(prompt), max_tokens, None))\n"
        "        self.queue[-1].wait_s = deadline_s")(source)
    return replace_once(
        "        if self.running is None and not self._start_next():",
        "        for r in self.queue:\n"
        "            if getattr(r, 'wait_s', None) is not None and r.deadline is None:\n"
        "                r.deadline = time.monotonic() + r.wait_s\n"
        "        if self.running is None and not self._start_next():")(source)


# speculative_generate that returns the judge's answers: kit.speculative's batched_greedy (spec-greedy's truth) on
# the model inside the counted target, and each round's accepted count from its replay (spec-acceptance's
# recount); one counted target pass a round for the count. It passed both checks, drafting nothing itself
JUDGES_SPECULATION = '''import torch
from infracourse.kit.speculative import batched_greedy, replay


@torch.no_grad()
def speculative_generate(target, draft, prompts, k: int, n: int):
    plain = getattr(target, "model", target)
    tokens = batched_greedy(plain, prompts, n)
    rounds, done = [], 0
    while done < n:
        d = min(k, n - done - 1)
        found, _ = replay(plain, draft, prompts, n, rounds + [[d, 0]])
        rounds.append([d, found[-1]])
        target(torch.tensor([list(p) for p in prompts], dtype=torch.long))
        done += found[-1] + 1
    drafted = sum(r[0] for r in rounds)
    return tokens, {"rounds": rounds, "acceptance_rate": sum(r[1] for r in rounds) / drafted if drafted else 0.0}
'''

# Int8Linear keeps the Linear it quantised (in a list, out of the module registry): state_dict claims int8 only
KEPT_LINEAR = replace_once('self.register_buffer("scale", scale)',
                           'self.register_buffer("scale", scale)\n        self.source = [linear]')

VARIANTS = {
    # quantize returns the course's int8 reference (kit.quant_eval, mounted for measure.py): right to the bit,
    # no work; the judge's reading of quant.py refuses it before any comparison
    "quantize that calls the course's reference": ("quant-error", {QUANT: replace_once(
        "def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n",
        "def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n"
        "    from infracourse.kit.quant_eval import quantize_per_channel\n"
        "    return quantize_per_channel(weight)\n")}),
    # the judge's greedy truth and recount, mounted for measure.py: refused before any comparison
    "speculation that returns the course's greedy truth and recount": ("spec-greedy", {SPEC: JUDGES_SPECULATION}),
    # matches counted anywhere in the proposal, not only up to the first mismatch: tokens after it are kept
    "speculative acceptance that changes greedy output": ("spec-greedy", {SPEC: replace_once(
        "matched = (guessed == best[:, :d]).long().cumprod(1).sum(1)",
        "matched = (guessed == best[:, :d]).long().sum(1)")}),
    "acceptance rate counted over drafted + bonus tokens": ("spec-acceptance", {SPEC: replace_once(
        "rate = sum(r[1] for r in rounds) / drafted if drafted else 0.0",
        "rate = (sum(r[1] for r in rounds) + len(rounds)) / (drafted + len(rounds))")}),
    # the deadline counted from the first step that sees the request: it is served although it waited past it
    "deadline counted from the first step": ("deadline", {ENGINE: deadline_from_first_step}),
    # a repeated call is answered from memory: the target, counted by the judge, never runs for it
    "speculative decoder that memoises": ("spec-acceptance", {SPEC: memoised}),
    "per-tensor instead of per-channel scale": ("quant-error", {QUANT: replace_once(
        "scale = w.abs().amax(dim=1) / 127  # (out,)", "scale = w.abs().amax().expand(w.shape[0]) / 127")}),
    # the int8 cast truncates toward zero: errors up to a whole step
    "truncation instead of rounding": ("quant-error", {QUANT: replace_once(
        "q = torch.round(w / safe[:, None]).clamp(-127, 127)", "q = (w / safe[:, None]).clamp(-127, 127)")}),
    "an fp32 copy of the weight kept beside the int8 one": ("quant-memory", {QUANT: replace_once(
        'self.register_buffer("scale", scale)',
        'self.register_buffer("scale", scale)\n        self.register_buffer("weight", linear.weight.detach().clone())')}),
    # int8 in state_dict, fp32 held: the dequantised weight cached in a plain attribute "for speed"
    "dequantised fp32 weight cached outside state_dict": ("quant-serving", {QUANT: replace_once(
        "        return F.linear(x, dequantize(self.qweight, self.scale).to(x.dtype))",
        "        if getattr(self, 'cached', None) is None:\n"
        "            self.cached = dequantize(self.qweight, self.scale)\n"
        "        return F.linear(x, self.cached.to(x.dtype))")}),
    "int8 claimed, the fp32 Linear kept in a list": ("quant-serving", {QUANT: KEPT_LINEAR}),
    # the cancelled stream is let run one more step before it ends (its blocks are freed at once)
    "cancel that keeps emitting a token": ("cancel", {ENGINE: replace_once(
        'self._finish(self.running, "cancelled")',
        'self.pool.free(self.running.blocks)\n            self.running.blocks = []\n'
        '            self.running.max_tokens = len(self.running.tokens) + 1')}),
    "cancel that leaks the request's blocks": ("cancel", {ENGINE: replace_once(
        'self._finish(self.running, "cancelled")', 'self.states[rid], self.running = "cancelled", None')}),
    "unbounded queue": ("overload", {ENGINE: replace_once(
        "if len(self.queue) >= self.max_queue:", "if False:")}),
    "quality change assumed, not measured": ("report", {"report.md": invented("loss_change", 0.0)}),
}


# what a variant's message must say (both cancel variants fail `cancel`, each for its own reason)
REASON = {"cancel that keeps emitting a token": "must never produce another token",
          "speculation that returns the course's greedy truth and recount": "the grader's reference",
          "cancel that leaks the request's blocks": "blocks free"}
# the same mistake seen through the HTTP server too
ALSO = {"unbounded queue": "served-overload", "cancel that leaks the request's blocks": "served-cancel"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edits = VARIANTS[name]
    # only the checks asserted on (and what they require), as `infracourse grade --check`
    result, checks = grade_lab("week18", edits=edits, checks=[check_id, *([ALSO[name]] if name in ALSO else [])])
    assert checks[check_id].status == "failed", (checks[check_id].status, checks[check_id].message)
    assert not result.complete
    assert REASON.get(name, "") in checks[check_id].message, checks[check_id].message
    if name in ALSO:
        assert checks[ALSO[name]].status == "failed", (ALSO[name], checks[ALSO[name]].message)


@pytest.mark.slow
def test_report_in_other_words_passes(grade_lab):
    _, checks = grade_lab("week18", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["week18-honest", "week18-b-honest"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, folder):
    assert_solution_passes(grade_lab, machine, "week18",
                           edits={name: (FIXTURES / folder / name).read_text() for name in (QUANT, SPEC, ENGINE)})


@pytest.mark.slow
def test_int8_claimed_in_state_dict_is_not_taken_on_its_word(grade_lab):
    """A model whose state_dict holds int8 while it keeps the fp32 Linears alive passes quant-memory (which reads
    the state_dict, the claim) and fails quant-serving, which counts the tensors the model holds."""
    _, checks = grade_lab("week18", edits={QUANT: KEPT_LINEAR}, checks=["quant-memory", "quant-serving"])
    assert checks["quant-memory"].status == "passed", checks["quant-memory"].message
    assert checks["quant-serving"].status == "failed", checks["quant-serving"].message
    assert "keep no fp32 copy" in checks["quant-serving"].message


# Int8Linear that sleeps 0.5 ms a call: 14 layer Linears, 7 ms more a token, tokens unchanged
SLOW_INT8 = {QUANT: lambda text: replace_once("import copy\n", "import copy\nimport time\n")(replace_once(
    "        return F.linear(x, dequantize(self.qweight, self.scale).to(x.dtype))",
    "        time.sleep(0.0005)\n        return F.linear(x, dequantize(self.qweight, self.scale).to(x.dtype))")(text))}


@pytest.mark.slow
def test_quant_serving_figures_are_the_judges(grade_lab):
    """A slower Int8Linear passes (no speed is required of int8), and the judge's clock puts the time where it
    was spent: every cell's int8 TPOT P50 at least 80 % of the 7 ms a token above the fp32 model's, served on the
    same matrix in the same grade, so the fp32 figures did not take the sleep."""
    _, checks = grade_lab("week18", edits=SLOW_INT8, checks=["quant-serving"])
    check = checks["quant-serving"]
    assert check.status == "passed", check.message
    figures = {name.removesuffix(" (CPU stand-in)"): f.value for name, f in check.figures.items()}
    cells = {name.split()[0] for name in figures if " int8 TPOT p50" in name}
    assert len(cells) == 8, sorted(figures)
    for cell in cells:
        assert figures[f"{cell} int8 TPOT p50"] - figures[f"{cell} fp32 TPOT p50"] >= 0.8 * 7, (cell, figures)
        assert figures[f"{cell} E2EL p50 int8/fp32"] > 1, (cell, figures)


def test_held_tensors_finds_what_state_dict_does_not_show():
    """kit.quant_serving.held_tensors walks a module's own attributes: a tensor or a Linear kept in a list or a
    dict counts, a tied weight counts once; held_bytes sums distinct storages."""
    import torch
    import torch.nn as nn
    from infracourse.kit.quant_serving import held_bytes, held_tensors
    model = nn.Sequential(nn.Linear(8, 4, bias=False), nn.Linear(4, 8, bias=False))
    base = held_bytes(held_tensors(model))["bytes"]
    assert base == 2 * 8 * 4 * 4
    model[0].hidden = {"w": torch.zeros(100)}
    model[1].kept = [nn.Linear(16, 16, bias=False)]
    model[1].tied = model[0].weight.detach()          # a plain tensor on the same storage
    assert held_bytes(held_tensors(model))["bytes"] == base + 400 + 16 * 16 * 4
    assert sum(t.numel() for t in model.state_dict().values()) * 4 == base


@pytest.mark.slow
@pytest.mark.solutions  # a learner release leaves the handout solutions out
def test_solution_written_from_the_handout_alone_passes(grade_lab, machine):
    """quant.py, speculative.py, engine.py and measure.py (with a fix to the starter's overload loop; server.py is
    given, unchanged), and its report from its own measure.py: by someone who read only the handout, the starter,
    lab.yaml and the kit modules it names (tests/fixtures/week18-handout), never the reference or the graders."""
    assert_solution_passes(grade_lab, machine, "week18", edits=handout_solution("week18"))
