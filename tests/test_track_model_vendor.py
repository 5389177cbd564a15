"""The model-vendor track (weeks 22-24) proves its grader: the solution passes weeks 22 and 24, the starter fails
with teaching messages, an honest solution in another style (mask-based dispatch with fixed-size buffers and the
list form of all_to_all, another EPLB rule: tests/fixtures/track-model-vendor-honest) passes, and each wrong
variant the issue names fails its check: an MoE that drops overflow tokens silently, a combine that double-counts,
a lock file whose versions disagree with the environment. Plus fast unit tests of kit.moe."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, replace_once
from labproof import assert_solution_passes, assert_variant_fails
from infracourse.kit import moe as kit

TRACK = "model-vendor"
HONEST = Path(__file__).parent / "fixtures" / "track-model-vendor-honest"


# ------------------------------------------------------------------------------------------ kit.moe, fast
def _naive(c: dict, rank: int, top_k: int, capacity: int | None) -> tuple[torch.Tensor, int]:
    """The layer written out token by token: the reference must equal it."""
    x, logits = c["x"][rank], c["logits"][rank]
    probs = torch.softmax(logits, -1)
    out, sent, dropped = torch.zeros_like(x), {}, 0
    for t in range(x.shape[0]):
        gate, expert = probs[t].topk(top_k)
        gate = gate / gate.sum()
        for j in range(top_k):
            e = int(expert[j])
            sent[e] = sent.get(e, 0) + 1
            if capacity is not None and sent[e] > capacity:
                dropped += 1
                continue
            out[t] += gate[j] * (F.gelu(x[t] @ c["w_in"][e]) @ c["w_out"][e])
    return out, dropped


@pytest.mark.parametrize("trace,factor", [("uniform", None), ("uniform", 1.0), ("skewed", 0.5)])
def test_dense_reference_is_the_layer_written_out(trace, factor):
    c = kit.case(11, trace)
    cap = kit.capacity_for(kit.TOKENS, kit.TOP_K, kit.EXPERTS, factor)
    ref = kit.dense_moe(c, kit.TOP_K, cap)
    for rank in range(kit.WORLD):
        out, dropped = _naive(c, rank, kit.TOP_K, cap)
        assert torch.allclose(ref["out"][rank], out, rtol=1e-12, atol=1e-12)
        assert ref["dropped"][rank] == dropped
    if factor is not None:
        assert sum(ref["dropped"]) > 0  # the graded capacity experiments do drop


def test_skewed_trace_overloads_rank_zero_and_eplb_model_relieves_it():
    ref = kit.dense_moe(kit.case(kit.FIXED_SEED, "skewed"), kit.TOP_K, None)
    stats = kit.routing_stats(ref["expert"].reshape(-1, kit.TOP_K))
    assert stats["rank_imbalance"] > 2.5 and stats["tokens_per_rank"][0] == max(stats["tokens_per_rank"])
    placement = [[0, 1, 6], [0, 1, 5], [0, 7, 3], [1, 2, 4]]
    assert kit.check_placement(placement) is None
    assert max(kit.balanced_split_loads(placement, stats["tokens_per_expert"])) < 0.5 * max(stats["tokens_per_rank"])
    assert "no replica" in kit.check_placement([[0, 1, 1], [0, 1, 1], [0, 1, 1], [2, 3, 4]])
    assert "exactly 3" in kit.check_placement([[0, 1], [2, 3], [4, 5], [6, 7]])


def test_experts_record_tokens_padding_and_strangers():
    c = kit.case(3, "uniform")
    table = c["x"].reshape(-1, kit.D_MODEL)
    expert = kit.Expert(5, c["w_in"][5], c["w_out"][5], table, counting=True)
    rows = torch.cat([table[[7, 40]], torch.zeros(2, kit.D_MODEL), 0.5 * table[[1]]])
    out = expert(rows)
    assert expert.record() == {"expert": 5, "seen": [7, 40], "padding": 2, "unknown": 1, "calls": 1}
    assert torch.equal(out, F.one_hot(torch.full((5,), 5), kit.D_MODEL).double())
    real = kit.Expert(5, c["w_in"][5], c["w_out"][5], table)
    assert torch.allclose(real(table[:3]), kit.expert_fn(table[:3], c["w_in"][5], c["w_out"][5]))


def _judging(monkeypatch):
    """graders/track-model-vendor/track_model_vendor_judging.py, the judge's side (never mounted in the sandbox)."""
    monkeypatch.syspath_prepend(str(REPO / "graders" / "track-model-vendor"))
    import track_model_vendor_judging
    return track_model_vendor_judging


def test_all_to_all_bytes_formula(monkeypatch):
    all_to_all_bytes = _judging(monkeypatch).all_to_all_bytes
    assert all_to_all_bytes(32, 16, 2, 4, 8) == 12288
    assert all_to_all_bytes(10, 4, 1, 1, 2) == 0  # one rank: nothing leaves it
    assert kit.capacity_for(32, 2, 8, 1.0) == 8 and kit.capacity_for(32, 2, 8, 1.25) == 10
    assert kit.capacity_for(32, 2, 8, None) is None


# ------------------------------------------------------------------------------------------ the grades
@pytest.mark.slow
def test_solution_passes_week22_with_only_its_checks(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week22", track=TRACK)
    assert set(checks) == {"environment-pinned", "run-command", "project-plan", "dense-baseline", "routing-stats"}


@pytest.mark.slow
def test_solution_passes_week24(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week24", track=TRACK)
    assert {"eplb-rebalance", "all-to-all-bytes", "capacity-failure-case", "report"} <= set(checks)


@pytest.mark.slow
def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week24", source="starter", stamp=False, track=TRACK)
    assert not result.complete
    assert "route" in checks["dense-baseline"].message and "not written" in checks["dense-baseline"].message
    assert "not written" in checks["routing-stats"].message
    assert "ep_moe (moe.py) is not written yet" in checks["ep-equals-dense"].message
    assert "ep_moe (moe.py) is not written yet" in checks["capacity-drops"].message
    assert "ep_moe (moe.py) is not written yet" in checks["dispatch-combine-once"].message
    assert "eplb_placement is not written yet" in checks["eplb-rebalance"].message
    assert "not written" in checks["all-to-all-bytes"].message
    assert "raw/failure.json is missing" in checks["capacity-failure-case"].message
    for check in ("environment-pinned", "run-command", "project-plan", "report"):
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)


# One week-23 grade carries two of the mistakes, each seen by its own check in its own experiment: the
# drops are not counted (capacity-drops reads only the counts) and the combine adds the rows the rank's own
# experts processed a second time (dispatch-combine-once reads the counting experts' combined rows).
SILENT_AND_DOUBLE = {"moe.py": lambda text: replace_once(
    '    return {"out": out, "dropped": dropped, "load": load}',
    '    return {"out": out, "dropped": 0, "load": load}  # drops overflow tokens silently')(replace_once(
        "    out = torch.zeros_like(x).index_add_(0, token, weight[:, None] * returned)\n",
        "    out = torch.zeros_like(x).index_add_(0, token, weight[:, None] * returned)\n"
        "    here = dest == rank  # the rows my own experts processed, added again\n"
        "    out.index_add_(0, token[here], weight[here, None] * outputs[:int(here.sum())])\n")(text))}


@pytest.mark.slow
@pytest.mark.variant
def test_silent_drops_and_double_counting_combine_fail_their_checks(grade_lab):
    result, checks = grade_lab("week23", edits=SILENT_AND_DOUBLE, track=TRACK)
    assert not result.complete
    assert checks["capacity-drops"].status == "failed", checks["capacity-drops"].message
    assert "dropped AND counted" in checks["capacity-drops"].message
    assert checks["dispatch-combine-once"].status == "failed", checks["dispatch-combine-once"].message
    assert "2 times its gate, expected 1 time" in checks["dispatch-combine-once"].message
    assert checks["dense-baseline"].status == "passed"  # the single-process layer is untouched


def _torch_pin_off(text: str) -> str:
    pin = re.search(r"^torch==(\S+)$", text, re.MULTILINE)
    assert pin, text
    return text.replace(pin.group(0), "torch==2.0.1")


@pytest.mark.variant
def test_a_dense_moe_that_calls_the_reference_fails(grade_lab):
    """The handout names kit.moe as the grader's reference, to read: a dense_moe that returns the reference's own
    answer (right outputs, no work) fails dense-baseline, naming the import."""
    def edit(text: str) -> str:
        head, sep, tail = text.partition("def dense_moe(x, logits, w_in, w_out, top_k, capacity):")
        assert sep, "the solution's dense_moe moved"
        return (head + "from infracourse.kit import moe as _reference\n\n\n" + sep +
                "\n    c = {'x': x[None], 'logits': logits[None], 'w_in': w_in, 'w_out': w_out}\n"
                "    ref = _reference.dense_moe(c, top_k, capacity)\n"
                "    return {'out': ref['out'][0], 'dropped': int(ref['dropped'][0])}\n\n\n"
                "def _unused_dense_moe(x, logits, w_in, w_out, top_k, capacity):" + tail)

    check = assert_variant_fails(grade_lab, "week22", "dense-baseline", {"moe.py": edit}, track=TRACK)
    assert "the grader's reference" in check.message and "moe.py:" in check.message, check.message



@pytest.mark.variant
def test_the_judges_all_to_all_formula_is_out_of_the_learners_reach(grade_lab, monkeypatch):
    """kit.moe, mounted, held the formula all-to-all-bytes compares with: an estimates.py that re-exported it
    passed. It is now track_model_vendor_judging's, and the same file no longer imports."""
    assert not hasattr(kit, "all_to_all_bytes") and callable(_judging(monkeypatch).all_to_all_bytes)
    edits = {"estimates.py": "from infracourse.kit.moe import all_to_all_bytes  # noqa: F401\n"}
    _, checks = grade_lab("week23", edits=edits, track=TRACK, checks=["all-to-all-bytes"])
    check = checks["all-to-all-bytes"]
    assert check.status != "passed" and "cannot import name 'all_to_all_bytes'" in check.message, \
        (check.status, check.message)

@pytest.mark.slow
@pytest.mark.variant
def test_lock_that_disagrees_with_the_environment_fails(grade_lab):
    assert_variant_fails(grade_lab, "week22", "environment-pinned", {"requirements.lock": _torch_pin_off},
                         track=TRACK)


def _honest_report(text: str) -> str:
    """The stamped solution report with the honest placement's figure and comparison."""
    text = replace_once("max_rank_load_eplb: 73 ", "max_rank_load_eplb: 86 ")(text)
    section = re.compile(r"^## Optimisation comparison\n.*?(?=^## )", re.MULTILINE | re.DOTALL)
    return section.sub(lambda _: (
        "## Optimisation comparison\n"
        "Replicas in proportion to each expert's load (largest remainder) give the placement "
        "[[1, 0, 5], [1, 7, 4], [0, 2, 3], [0, 2, 6]]; the busiest rank now runs 86 token rows instead of 203, "
        "the others 56-57. Expert 0 has three copies and the rule gives expert 1 only two, which is why rank 0 "
        "stays above the others. The layer's output is unchanged; the forward is no faster on 2 CPU cores.\n\n"),
        text, count=1)


@pytest.mark.slow
def test_honest_solution_in_another_style_passes(grade_lab, machine):
    edits = {"moe.py": (HONEST / "moe.py").read_text(), "report.md": _honest_report}
    assert_solution_passes(grade_lab, machine, "week24", edits=edits, track=TRACK)
