"""Week 10 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import invented, reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    checks = assert_solution_passes(grade_lab, machine, "week10")
    if not machine.gpu_count:
        assert "needs a CUDA GPU" in checks["end-to-end"].message
    else:  # the reference solution's targets on the H200: >= 85 % of copy bandwidth, faster than F.rms_norm
        for figure in checks["forward-bandwidth"].figures.values():
            assert figure.fraction_of_ceiling >= 0.85, checks["forward-bandwidth"].figures
        for figure in checks["forward-vs-torch"].figures.values():
            assert figure.value >= 1.0, checks["forward-vs-torch"].figures


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week10", source="starter", stamp=False)
    assert not result.complete
    assert checks["forward-correct"].status == "failed"
    assert "write _forward_kernel" in checks["forward-correct"].message
    assert checks["model-integration"].status == "failed", checks["model-integration"].message
    assert checks["report"].status == "failed"
    assert "in your own words" in checks["report"].message


BACKWARD_DX = "dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols))"


def torch_backward_unless(watched: str, text: str) -> str:
    """The solution whose backward computes dx and dw with torch ops except when `watched` holds."""
    return replace_once(
        "        dy2 = _rows(dy)\n",
        "        dy2 = _rows(dy)\n"
        f"        if not ({watched}):\n"
        "            x_hat = x2.float() * rstd[:, None]\n"
        "            g = dy2.float() * weight.float()\n"
        "            dx = rstd[:, None] * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))\n"
        "            return dx.to(x2.dtype).view(ctx.shape), (dy2.float() * x_hat).sum(0).to(weight.dtype), None\n")(text)
VARIANTS = {
    # dx through the direct path only: the path through rstd (the mean term) is forgotten
    "gradient without the mean term": ("backward-correct", replace_once(BACKWARD_DX, "dx = rstd * g")),
    # dx off by a factor of rstd (invisible when rms(x) happens to be 1)
    "gradient off by a factor": ("backward-correct", replace_once(
        BACKWARD_DX, "dx = g - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols)")),
    # dw takes only the first program's share of the rows
    "dw not reduced across programs": ("backward-correct", replace_once(
        "(partial, dw, programs, n,", "(partial, dw, 1, n,")),
    # the kernel runs, torch ops give the answer
    "forward computed with torch ops": ("kernel-did-work", replace_once(
        "        return y.view(x.shape)",
        "        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)"
        " * weight).to(x.dtype)")),
    "dw summed with torch": ("kernel-did-work", replace_once(
        "        _column_sum_kernel[(triton.cdiv(n, 64),)](partial, dw, programs, n, BLOCK_ROWS=32, BLOCK_COLS=64)",
        "        dw.copy_(partial.sum(0))")),
    # class 7: dw's running sum over rows kept in the input dtype: right for a few rows, wrong for many
    "dw summed over rows in fp16/bf16": ("backward-correct", replace_once(
        "        dw += dy * x_hat\n", "        dw = (dw + dy * x_hat).to(dx_ptr.dtype.element_ty).to(tl.float32)\n")),
    # class 7: the kernels run only at what the grader watched once (x (16, 96) fp32); torch ops everywhere else
    "backward in torch off the watched shape": ("kernel-did-work", lambda text: torch_backward_unless(
        "tuple(dy.shape) == (16, 96)", text)),
    "backward in torch off fp32": ("kernel-did-work", lambda text: torch_backward_unless(
        "dy.dtype == torch.float32", text)),
    "backward in torch off a contiguous dy": ("kernel-did-work", lambda text: torch_backward_unless(
        "dy.is_contiguous()", text)),
    "forward in torch off the watched width": ("kernel-did-work", replace_once(
        "        x2, weight = _rows(x), weight.contiguous()",
        "        if x.shape[-1] != 96:\n"
        "            ctx.save_for_backward(_rows(x), weight, torch.rsqrt(_rows(x).float().pow(2).mean(-1) + eps))\n"
        "            ctx.shape = x.shape\n"
        "            return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)"
        " * weight.float()).to(x.dtype)\n"
        "        x2, weight = _rows(x), weight.contiguous()")),
    # the row's tail lanes load past the row's end (the next row, or past the tensor)
    "no mask on the forward load": ("masks", replace_once(
        "x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)\n"
        "    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n    rstd",
        "x = tl.load(x_ptr + row * stride_x + cols).to(tl.float32)\n"
        "    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n    rstd")),
    # the backward stores dx past the row's end
    "no mask on the dx store": ("masks", replace_once(
        "dx.to(dx_ptr.dtype.element_ty), mask=mask)", "dx.to(dx_ptr.dtype.element_ty))")),
    # squares taken in the input dtype: fp16 values of 600 overflow
    "no upcast before squaring": ("edge-inputs", replace_once(
        "x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)\n"
        "    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n    rstd",
        "x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)\n"
        "    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n    rstd")),
    # eps added after the square root: the same result on ordinary rows, not on small ones
    "eps outside the square root": ("edge-inputs", replace_once(
        "rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)",
        "rstd = 1.0 / (tl.sqrt(tl.sum(x * x, axis=0) / n_cols) + eps)")),
}




# Wrong only on a GPU: the interpreter has no bandwidth to lose.
GPU_VARIANTS = {
    # y written in fp32 and converted afterwards: an extra copy, three times the traffic for bf16
    "fp32 output then a copy": ("forward-bandwidth", lambda text: replace_once(
        "        return y.view(x.shape)", "        return y.view(x.shape).to(x.dtype)")(replace_once(
            "y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)",
            "y = torch.empty(x2.shape, dtype=torch.float32, device=x.device)")(text))),
}


@pytest.mark.parametrize("name", list(VARIANTS) + list(GPU_VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, machine, name):
    if name in GPU_VARIANTS and not machine.gpu_count:
        pytest.skip("wrong only on a GPU")
    check_id, edit = {**VARIANTS, **GPU_VARIANTS}[name]
    assert_variant_fails(grade_lab, "week10", check_id, {"rmsnorm.py": edit})


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week10", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    if not machine.gpu_count:
        pytest.skip("the figure is measured on a GPU; without one its check is blocked and it is not compared")
    _, checks = grade_lab("week10", edits={"report.md": invented("end_to_end_speedup", 10.0)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "end_to_end_speedup = " in checks["report"].message and "the grader measured" in checks["report"].message
