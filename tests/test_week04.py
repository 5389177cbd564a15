"""Week 4 proves its grader: the solution passes, the starter fails, each wrong variant fails its check, and an
honest solution written from the handout in another style (tests/fixtures/week04-honest) passes."""
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week04")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week04", source="starter", stamp=False)
    assert not result.complete
    assert all(c.status == "failed" for c in checks.values()), {c.id: c.status for c in checks.values()}
    assert "answer 'view' or 'copy'" in checks["views-predict"].message
    assert "swap two dims with as_strided" in checks["views-transpose-no-copy"].message
    assert "derive and compute the gradients" in checks["autograd-gradcheck"].message \
        or "compute the norm" in checks["autograd-gradcheck"].message


VARIANTS = {
    "views.py": {
        # the swap is right, then .contiguous() copies it out of x's storage
        "transpose that copies": ("views-transpose-no-copy", replace_once(
            "return x.as_strided(size, stride, x.storage_offset())",
            "return x.as_strided(size, stride, x.storage_offset()).contiguous()")),
        "transpose through torch.transpose": ("views-transpose-no-copy", replace_once(
            "return x.as_strided(size, stride, x.storage_offset())", "return x.transpose(dim0, dim1)")),
        "windows forget the storage offset": ("views-sliding-window", replace_once(
            "(step * x.stride(0), x.stride(0)), x.storage_offset())", "(step * x.stride(0), x.stride(0)), 0)")),
        "windows assume stride 1": ("views-sliding-window", replace_once(
            "(step * x.stride(0), x.stride(0))", "(step, 1)")),
        "contiguity checks the stride of size-1 dims": ("views-strides", replace_once(
            "if size != 1 and step != expected:", "if step != expected:")),
        "a wrong prediction": ("views-predict", replace_once('"x.contiguous()": "view"', '"x.contiguous()": "copy"')),
    },
    "rmsnorm_function.py": {
        "gradient off by a factor": ("autograd-gradcheck", replace_once(
            "return grad_x, grad_weight, None", "return grad_x, 2 * grad_weight, None")),
        "sum where the mean belongs": ("autograd-gradcheck", replace_once(
            "(g * x_hat).mean(-1, keepdim=True)", "(g * x_hat).sum(-1, keepdim=True)")),
        "autograd instead of the Function": ("autograd-gradcheck", replace_once(
            "return RMSNormFunction.apply(x, weight, eps)",
            "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight")),
        # class 4: the Function is used, but its backward has autograd differentiate a recomputed forward
        "backward by torch.autograd.grad inside the Function": ("autograd-gradcheck", replace_once(
            "        g = grad_out * weight\n"
            "        grad_x = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))\n"
            "        grad_weight = (grad_out * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)\n",
            "        with torch.enable_grad():\n"
            "            x = (x_hat / rstd).detach().requires_grad_()\n"
            "            w = weight.detach().requires_grad_()\n"
            "            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w\n"
            "            grad_x, grad_weight = torch.autograd.grad(y, (x, w), grad_out)\n")),
        "backward by torch.func.vjp inside the Function": ("autograd-gradcheck", replace_once(
            "        g = grad_out * weight\n"
            "        grad_x = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))\n"
            "        grad_weight = (grad_out * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)\n",
            "        def f(x, w):\n"
            "            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w\n"
            "        _, vjp = torch.func.vjp(f, x_hat / rstd, weight)\n"
            "        grad_x, grad_weight = vjp(grad_out)\n")),
        "eps outside the square root": ("autograd-matches-unfused", replace_once(
            "rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)",
            "rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) + eps")),
    },
    "blocks.py": {
        # class 4: right values from tensor ops, but the hand-written backward is bypassed
        "norm that bypasses the Function": ("block-norm", replace_once(
            "return rms_norm(x.float(), self.weight.float(), self.eps).to(x.dtype)",
            "x32 = x.float()\n"
            "        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float())"
            ".to(x.dtype)")),
        "attention without the causal mask": ("block-attention", replace_once(
            'probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)', "probs = scores.softmax(dim=-1)")),
        "attention without the 1/sqrt(d) scale": ("block-attention", replace_once(
            "(q @ k.transpose(-2, -1)) / math.sqrt(head_dim)", "q @ k.transpose(-2, -1)")),
        "softmax without subtracting the max": ("block-attention", replace_once(
            'probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)',
            'e = scores.masked_fill(future, float("-inf")).exp()\n        probs = e / e.sum(-1, keepdim=True)')),
        "attention by the library": ("block-attention", replace_once(
            "y = probs @ v", "y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)")),
        "tanh-approximated GELU": ("block-mlp", replace_once(
            "0.5 * h * (1 + torch.erf(h / math.sqrt(2)))",
            "0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))")),
        "q strides written as if contiguous": ("block-layouts", replace_once(
            '"q": ((B, H, T, D), (T * 3 * C, D, 3 * C, 1))', '"q": ((B, H, T, D), (H * T * D, T * D, D, 1))')),
    },
}
CASES = [(file, name) for file, variants in VARIANTS.items() for name in variants]


@pytest.mark.parametrize("file,name", CASES, ids=[name for _, name in CASES])
def test_wrong_variant_fails_its_check(grade_lab, file, name):
    check_id, edit = VARIANTS[file][name]
    assert_variant_fails(grade_lab, "week04", check_id, {file: edit})


# blocks.py whose three modules are kit.gpt's own (the judge's references, mounted for the worker)
COURSE_MODULES = ("from infracourse.kit import gpt\n\n\n"
                  "class RMSNorm(gpt.RMSNorm):\n    pass\n\n\n"
                  "class CausalSelfAttention(gpt.CausalSelfAttention):\n    pass\n\n\n"
                  "class MLP(gpt.MLP):\n    pass\n")


@pytest.mark.variant
def test_blocks_that_are_the_courses_own_fail(grade_lab):
    """The judge's reference modules returned as the learner's give its answers exactly; each block check still
    fails them on their mechanism: no RMSNormFunction node, the fused attention and GELU ops."""
    layouts = (Path(__file__).parent.parent / "labs" / "week04-tensors-autograd" / "solution" / "blocks.py").read_text()
    edits = {"blocks.py": COURSE_MODULES + layouts[layouts.index("\ndef layouts("):]}
    _, checks = grade_lab("week04", edits=edits, checks=["block-norm", "block-attention", "block-mlp"])
    for check_id, cause in (("block-norm", "has no RMSNormFunction node"), ("block-attention", "scaled_dot_product"),
                            ("block-mlp", "called ['gelu']")):
        assert checks[check_id].status == "failed" and cause in checks[check_id].message, \
            (check_id, checks[check_id].status, checks[check_id].message)

def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week04", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


HONEST = Path(__file__).parent / "fixtures" / "week04-honest"


@pytest.mark.parametrize("style", ["week04-honest", "week04-b-honest"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, style):
    files = ("views.py", "rmsnorm_function.py", "blocks.py")
    result, checks = grade_lab("week04", edits={name: (HONEST.parent / style / name).read_text() for name in files})
    for check in checks.values():
        expected = "passed" if machine.satisfies(check.needs) else "blocked"
        assert check.status == expected, (check.id, check.status, check.message)
    assert result.complete
