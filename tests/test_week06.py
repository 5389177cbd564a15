"""Week 6 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails
from reportproof import invented, reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week06")
    if not machine.gpu_count:
        assert "needs a CUDA GPU" in checks["memory-gpu-peak"].message


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week06", source="starter", stamp=False)
    assert not result.complete
    for check_id in ("memory-params", "memory-grads", "memory-optimizer", "memory-activations"):
        assert checks[check_id].status == "failed"
        assert "count the bytes of each part" in checks[check_id].message
    # the starter runs the provided step: right results, with its sync and its copy
    assert checks["step-correct"].status == "passed"
    assert "_local_scalar_dense" in checks["profile-no-sync"].message
    assert "aten::cat" in checks["profile-no-copy"].message


VARIANTS = {
    "memory.py": {
        "Adam states counted once": ("memory-optimizer", replace_once("else 2 * e * n", "else e * n")),
        "fp32 master weights forgotten": ("memory-optimizer", replace_once("3 * 4 * n if", "2 * 4 * n if")),
        "tied head counted twice": ("memory-params", replace_once(
            "return cfg.vocab_size * C +", "return 2 * cfg.vocab_size * C +")),
        "bf16 gradients counted as fp32": ("memory-grads", replace_once('"grads": e * n', '"grads": 4 * n')),
        "log-softmax output left out": ("memory-activations", replace_once(
            "head = norm + e * B * T * V", "head = norm")),
    },
    "step.py": {
        "loss read with .item() every step": ("profile-no-sync", replace_once(
            'metrics.get("loss_sum", 0.0) + loss.detach()', 'metrics.get("loss_sum", 0.0) + loss.item()')),
        "gradients concatenated for the norm": ("profile-no-copy", replace_once(
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM, foreach=True)\n",
            "    grads = [p.grad for p in model.parameters()]\n"
            "    norm = torch.cat([g.flatten() for g in grads]).norm()\n"
            "    torch._foreach_mul_(grads, (MAX_GRAD_NORM / (norm + 1e-6)).clamp(max=1.0))\n")),
        "clipping dropped": ("step-correct", replace_once(
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM, foreach=True)\n", "")),
    },
}
CASES = [(file, name) for file, variants in VARIANTS.items() for name in variants]


@pytest.mark.parametrize("file,name", CASES, ids=[name for _, name in CASES])
def test_wrong_variant_fails_its_check(grade_lab, file, name):
    check_id, edit = VARIANTS[file][name]
    assert_variant_fails(grade_lab, "week06", check_id, {file: edit})


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week06", edits={"report.md": reworded})
    assert checks["report"].status == "passed", checks["report"].message


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    if not machine.gpu_count:
        pytest.skip("the figure is measured on a GPU; without one its check is blocked and it is not compared")
    _, checks = grade_lab("week06", edits={"report.md": invented("estimated_total_bytes", 10.0)})
    assert checks["report"].status == "failed"
    assert "estimated_total_bytes = " in checks["report"].message and "the grader measured" in checks["report"].message
