"""Week 8 proves its grader: the solution passes on both routes, the starter fails, each wrong variant fails
its check."""
import shutil

import pytest

from conftest import REPO, replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import invented, reworded

pytestmark = pytest.mark.slow

CUDA_ROUTE = {"softmax.py": replace_once('BACKEND = "triton"', 'BACKEND = "cuda"')}


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week08")
    if not machine.gpu_count:
        assert "needs a CUDA GPU" in checks["bandwidth"].message


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week08", source="starter", stamp=False)
    assert not result.complete
    for check_id in ("correct", "long-rows", "stability", "masks", "kernel-did-work"):
        assert checks[check_id].status == "failed", (check_id, checks[check_id].message)
    assert "write the kernels" in checks["correct"].message
    assert checks["report"].status == "failed"
    assert "in your own words" in checks["report"].message


def test_cuda_route_solution(grade_lab, machine):
    result, checks = grade_lab("week08", edits=CUDA_ROUTE)
    if machine.gpu_count:
        assert all(c.status == "passed" for c in result.checks), {c.id: c.message for c in result.checks}
        return
    for check_id in ("correct", "long-rows", "stability", "noncontiguous", "masks"):
        assert checks[check_id].status == "blocked", (check_id, checks[check_id].message)
        assert "CUDA C++ route" in checks[check_id].message
    # the compile check passes (with nvcc) yet no answer of the learner's kernel was checked here: blocked, and
    # the week is not complete on a CPU (a compile check is no correctness check)
    assert checks["kernel-did-work"].status == "blocked", checks["kernel-did-work"].message
    if shutil.which("nvcc"):
        assert "compiles with nvcc" in checks["kernel-did-work"].message, checks["kernel-did-work"].message
    assert not result.complete and not result.verified_on_gpu
    assert not any(c.status == "passed" and c.kind == "correctness" for c in result.checks)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU the kernel route is taken and graded")
def test_a_torch_fallback_off_the_gpu_is_not_complete_on_a_cpu(grade_lab):
    """A route no CPU check can run: the kernel only where x.is_cuda, torch.softmax elsewhere. Its answers are
    right, so the answer checks pass here; kernel-did-work must fail, or the week reads complete on a machine
    where the learner's kernel never ran."""
    fallback = replace_once("    if BACKEND == \"cuda\":\n", "    if not x.is_cuda:\n        return torch.softmax(x, dim=-1)\n"
                            "    if BACKEND == \"cuda\":\n")
    check = assert_variant_fails(grade_lab, "week08", "kernel-did-work", {"softmax.py": fallback})
    assert "torch compute ops" in check.message and "softmax" in check.message, check.message


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="compile-checking the CUDA route needs nvcc")
def test_cuda_route_starter_fails_the_compile_check(grade_lab, machine):
    starter = (REPO / "labs/week08-softmax/starter/softmax_cuda.cu").read_text()
    result, checks = grade_lab("week08", edits={**CUDA_ROUTE, "softmax_cuda.cu": starter})
    assert not result.complete
    assert checks["kernel-did-work"].status == "failed", checks["kernel-did-work"].message
    if not machine.gpu_count:
        assert "stores nothing" in checks["kernel-did-work"].message


FUSED_LOAD = ("    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float(\"inf\")).to(tl.float32)\n"
              "    numerator = tl.exp(x - tl.max(x, axis=0))  # the largest exponent is 0: nothing overflows\n")
VARIANTS = {
    # exp(x) straight away: inf / inf = NaN at |x| ~ 10^4
    "no max-subtraction": ("stability", replace_once(
        "numerator = tl.exp(x - tl.max(x, axis=0))", "numerator = tl.exp(x)")),
    # the tail of the row neither masked on load nor on store
    "mask missing on the tail": ("masks", replace_once(
        FUSED_LOAD + "    y = numerator / tl.sum(numerator, axis=0)\n"
        "    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)",
        FUSED_LOAD.replace("cols, mask=mask, other=-float(\"inf\")", "cols")
        + "    y = numerator / tl.sum(numerator, axis=0)\n"
        "    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty))")),
    # the library op computes the answer; a kernel is still launched for show
    "calls torch.softmax": ("kernel-did-work", replace_once(
        "    return y\n\n\n@functools.cache", "    return torch.softmax(x, dim=-1)\n\n\n@functools.cache")),
    # a precision downgrade: fp32 rows computed in fp16
    "computes in fp16": ("correct", replace_once(
        "mask=mask, other=-float(\"inf\")).to(tl.float32)\n    numerator",
        "mask=mask, other=-float(\"inf\")).to(tl.float16)\n    numerator")),
    # online softmax without rescaling the running sum when the maximum grows
    "no rescaling in the online loop": ("long-rows", replace_once(
        "d = d * tl.exp(m - shift) + tl.exp(x - shift)", "d = d + tl.exp(x - shift)")),
    # rows assumed to be n_cols apart: wrong on x[::2], column slices and broadcast rows
    "ignores the row stride": ("noncontiguous", replace_once(
        "(rows, out, n_cols, rows.stride(0), out.stride(0), BLOCK=block,",
        "(rows, out, n_cols, n_cols, out.stride(0), BLOCK=block,")),
    # the result written over the input (what a cache or a reference computed afterwards would not notice)
    "writes into its input": ("correct", replace_once(
        "    out = y.view(-1, n_cols)\n", "    out, y = rows, x\n")),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edit = VARIANTS[name]
    assert_variant_fails(grade_lab, "week08", check_id, {"softmax.py": edit})


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week08", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    if not machine.gpu_count:
        pytest.skip("the figure is measured on a GPU; without one its check is blocked and it is not compared")
    _, checks = grade_lab("week08", edits={"report.md": invented("wide_speedup_over_torch", 10.0)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "wide_speedup_over_torch = " in checks["report"].message and "the grader measured" in checks["report"].message
