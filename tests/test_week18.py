"""Week 18 proves its grader: the solution passes, the starter fails, each wrong variant the issue names fails
its check, and honest solutions in another style (tests/fixtures/week18-honest: scales applied after the matmul,
a speculative decoder that always drafts k and trims, an engine that cancels queued requests lazily) pass. The
served checks run the lab's server.py (uvicorn in the sandbox, grading.serving) over each engine."""
from pathlib import Path

import pytest
import torch

from conftest import replace_once
from labproof import assert_solution_passes
from reportproof import invented, reworded

HONEST = Path(__file__).parent / "fixtures" / "week18-honest"


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


# Int8Linear keeps the Linear it quantised (in a list, out of the module registry): state_dict claims int8 only
KEPT_LINEAR = replace_once('self.register_buffer("scale", scale)',
                           'self.register_buffer("scale", scale)\n        self.source = [linear]')

VARIANTS = {
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


# what each cancel variant's message must say: both fail `cancel`, each for its own reason
REASON = {"cancel that keeps emitting a token": "must never produce another token",
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
    assert checks["report"].status == "passed", checks["report"].message


@pytest.mark.slow
def test_honest_solution_in_another_style_passes(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week18",
                           edits={name: (HONEST / name).read_text() for name in (QUANT, SPEC, ENGINE)})


@pytest.mark.slow
def test_int8_claimed_in_state_dict_is_not_taken_on_its_word(grade_lab):
    """A model whose state_dict holds int8 while it keeps the fp32 Linears alive passes quant-memory (which reads
    the state_dict, the claim) and fails quant-serving, which counts the tensors the model holds."""
    _, checks = grade_lab("week18", edits={QUANT: KEPT_LINEAR}, checks=["quant-memory", "quant-serving"])
    assert checks["quant-memory"].status == "passed", checks["quant-memory"].message
    assert checks["quant-serving"].status == "failed", checks["quant-serving"].message
    assert "keep no fp32 copy" in checks["quant-serving"].message


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
