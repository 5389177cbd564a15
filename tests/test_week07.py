"""Week 7 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import invented, reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week07")
    if not machine.gpu_count:
        assert "needs a CUDA GPU" in checks["add-bandwidth"].message


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week07", source="starter", stamp=False)
    assert not result.complete
    assert checks["add-correct"].status == "failed"
    assert "write _add_kernel" in checks["add-correct"].message
    assert checks["report"].status == "failed"
    assert "in your own words" in checks["report"].message


VARIANTS = {
    # a load and a store without a mask: the last block runs past the end
    "missing mask": ("masks", replace_once(
        "    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)\n"
        "    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)\n"
        "    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)",
        "    x = tl.load(x_ptr + offsets).to(tl.float32)\n"
        "    y = tl.load(y_ptr + offsets).to(tl.float32)\n"
        "    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty))")),
    # partial sums kept in fp16
    "fp16 accumulator": ("reduce-accuracy", replace_once(
        "other=0.0).to(tl.float32)", "other=0.0).to(tl.float16)")),
    # the answer computed by torch, a kernel launched for show
    "calls torch.sum": ("kernel-did-work", replace_once(
        "        if partial.numel() == 1:\n            return partial.view(())",
        "        if partial.numel() == 1:\n            return x.float().sum() if n > 1 else partial.view(())")),
    # grid rounds down: the tail block is never launched
    "skips the tail block": ("add-correct", replace_once(
        "(triton.cdiv(n, ADD_BLOCK),)", "(max(n // ADD_BLOCK, 1),)")),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edit = VARIANTS[name]
    assert_variant_fails(grade_lab, "week07", check_id, {"vector_ops.py": edit})


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week07", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    if not machine.gpu_count:
        pytest.skip("the figure is measured on a GPU; without one its check is blocked and it is not compared")
    _, checks = grade_lab("week07", edits={"report.md": invented("add_gbps", 10.0)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "add_gbps = " in checks["report"].message and "the grader measured" in checks["report"].message
