"""Week 9 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import invented, reworded

pytestmark = pytest.mark.slow


def both(*edits):
    """Several replace_once edits applied to one file, in order."""
    def _edit(text):
        for edit in edits:
            text = edit(text)
        return text

    return _edit


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week09")
    if not machine.gpu_count:
        assert "needs a CUDA GPU" in checks["cublas-4096"].message
    else:  # the reference solution's target on the H200: >= 95 % of cuBLAS at both sizes
        for check_id in ("cublas-4096", "cublas-8192"):
            assert checks[check_id].headline.fraction_of_ceiling >= 0.95, checks[check_id].figures


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week09", source="starter", stamp=False)
    assert not result.complete
    assert checks["correct"].status == "failed"
    assert "write _matmul_kernel" in checks["correct"].message
    assert checks["roofline"].status == "failed"
    assert "not written yet" in checks["roofline"].message
    assert checks["report"].status == "failed"
    assert "in your own words" in checks["report"].message


VARIANTS = {
    # partial sums rounded to fp16 after every K tile
    "fp16 accumulator": ("accumulator", both(
        replace_once("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
                     "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)"),
        replace_once("acc = tl.dot(a, b, acc, input_precision=PRECISION)",
                     "acc += tl.dot(a, b, input_precision=PRECISION).to(tl.float16)"))),
    # the kernel runs for show, cuBLAS gives the answer
    "calls torch.mm": ("kernel-did-work", replace_once(
        "    return c\n\n\n# ----", "    c.copy_(torch.mm(a, b))\n    return c\n\n\n# ----")),
    # the partial last K tile loads whatever lies past the end of each row
    "no mask on the K tail": ("masks", both(
        replace_once("tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)", "tl.load(a_ptrs)"),
        replace_once("tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)", "tl.load(b_ptrs)"))),
    # edge tiles store their padding rows and columns past the edge of C
    "no mask on the M/N edges": ("masks", replace_once(
        "acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))",
        "acc.to(c_ptr.dtype.element_ty))")),
    # the grid rounds down: edge tiles are never computed
    "grid skips the edge tiles": ("correct", replace_once(
        'triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])',
        'max(M // meta["BLOCK_M"], 1) * max(N // meta["BLOCK_N"], 1)')),
    # strides assumed from the shape: right only for contiguous inputs
    "ignores strides": ("strided", replace_once(
        "a.stride(0), a.stride(1), b.stride(0), b.stride(1)", "K, 1, N, 1")),
    # tiles rounded to bf16 before the product: a precision downgrade for fp32 and fp16 inputs
    "inputs rounded to bf16": ("correct", replace_once(
        "acc = tl.dot(a, b, acc, input_precision=PRECISION)",
        "acc = tl.dot(a.to(tl.bfloat16).to(a.dtype), b.to(tl.bfloat16).to(b.dtype), acc, input_precision=PRECISION)")),
    # traffic counted without writing C
    "intensity forgets C": ("roofline", replace_once(
        "moved = (M * K + K * N + M * N) * dtype.itemsize", "moved = (M * K + K * N) * dtype.itemsize")),
}


# Wrong only on a GPU: the interpreter ignores tf32 and has no speed to lose.
GPU_VARIANTS = {
    # fp32 always on tf32 tensor cores, whatever torch.backends.cuda.matmul.allow_tf32 says
    "always tf32": ("fp32-precision", replace_once('PRECISION="ieee" if exact_fp32 else "tf32"', 'PRECISION="tf32"')),
    # the smallest tiles for every shape: correct, and far from cuBLAS on large squares
    "small tiles only": ("cublas-4096", replace_once("if M * N < 256 * 256:", "if M * N > 0:")),
}


@pytest.mark.parametrize("name", list(VARIANTS) + list(GPU_VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, machine, name):
    if name in GPU_VARIANTS and not machine.gpu_count:
        pytest.skip("wrong only on a GPU")
    check_id, edit = {**VARIANTS, **GPU_VARIANTS}[name]
    assert_variant_fails(grade_lab, "week09", check_id, {"matmul.py": edit})


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week09", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    _, checks = grade_lab("week09", edits={"report.md": invented("intensity_4096_bf16", 10.0)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "intensity_4096_bf16 = " in checks["report"].message and "the grader computes" in checks["report"].message
