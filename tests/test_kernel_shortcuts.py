"""Inputs a wrong kernel cannot survive (issue 10): each variant below passed the kernel graders before they
tested that input, and now fails the check meant for it. (The labs' own wrong variants are in test_weekNN.py.)"""
import pytest

from conftest import replace_once
from labproof import assert_variant_fails

pytestmark = pytest.mark.slow

VARIANTS = {
    # copies both operands only when x is strided: a contiguous x with a strided y reads y's storage linearly
    "week07 strided mix": ("week07", "add-noncontiguous", "vector_ops.py", replace_once(
        "    x, y = x.contiguous(), y.contiguous()\n",
        "    if not x.is_contiguous():\n        x, y = x.contiguous(), y.contiguous()\n")),
    # the online loop's running maximum starts at 0, not -inf: rows below -88 underflow every exp to 0 -> 0/0
    "week08 running max started at 0": ("week08", "stability", "softmax.py", replace_once(
        'm = tl.full([BLOCK], -float("inf"), tl.float32)', "m = tl.zeros([BLOCK], tl.float32)")),
    # dw takes only the first 4096 rows (a buffer or loop sized for the shapes someone tried)
    "week10 dw wrong beyond the first rows": ("week10", "backward-correct", "rmsnorm.py", replace_once(
        "        dw += dy * x_hat\n", "        dw += tl.where(row < 4096, dy * x_hat, 0.0)\n")),
    # dw's running sum kept in fp16: thousands of rows lose its low digits
    "week10 dw accumulated in fp16": ("week10", "backward-correct", "rmsnorm.py", lambda text: replace_once(
        "        dw += dy * x_hat\n", "        dw += (dy * x_hat).to(tl.float16)\n")(replace_once(
            "    dw = tl.zeros((BLOCK,), dtype=tl.float32)\n", "    dw = tl.zeros((BLOCK,), dtype=tl.float16)\n")(text))),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_the_check_meant_for_it(grade_lab, name):
    week, check_id, file, edit = VARIANTS[name]
    assert_variant_fails(grade_lab, week, check_id, {file: edit})


# Messages name the real cause: (week, check, file, edit, what the message must say)
CAUSES = {
    # the grid rounds down: the tail is never written (not a load past the end)
    "week07 tail block never launched": ("week07", "masks", "vector_ops.py", replace_once(
        "(triton.cdiv(n, ADD_BLOCK),)", "(max(n // ADD_BLOCK, 1),)"), "never written"),
    "week09 edge tiles never launched": ("week09", "correct", "matmul.py", replace_once(
        'triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])',
        'max(M // meta["BLOCK_M"], 1) * max(N // meta["BLOCK_N"], 1)'), "never written"),
    # one program too few: the last row is never written (week 8's and week 10's masks check)
    "week08 last row never launched": ("week08", "masks", "softmax.py", replace_once(
        "grid = (rows.shape[0],)", "grid = (max(rows.shape[0] - 1, 1),)"), "never written"),
    "week10 last row never launched": ("week10", "masks", "rmsnorm.py", replace_once(
        "_forward((x2.shape[0],)", "_forward((max(x2.shape[0] - 1, 1),)"), "never written"),
    # rows from the third on read rows 0 and 1: whole rows wrong, the rest right (not precision)
    "week08 rows loaded from the wrong place": ("week08", "correct", "softmax.py", replace_once(
        "x = tl.load(x_ptr + row * x_row_stride + cols", "x = tl.load(x_ptr + (row % 2) * x_row_stride + cols"),
        "while the rest of the output is right"),
    # bf16 tiles given to tl.dot under the interpreter: its fault, named as such, with what to do
    "week09 bf16 tiles not upcast in the interpreter": ("week09", "correct", "matmul.py", replace_once(
        "UPCAST=INTERPRET, **tiles)", "UPCAST=False, **tiles)"), "interpreter-only fault"),
}


@pytest.mark.variant  # a known-wrong variant's grade, like those of assert_variant_fails (the quick tier skips it)
@pytest.mark.parametrize("name", list(CAUSES))
def test_failure_message_names_the_real_cause(grade_lab, name):
    week, check_id, file, edit, cause = CAUSES[name]
    _, checks = grade_lab(week, edits={file: edit}, checks=[check_id])
    assert checks[check_id].status == "failed", checks[check_id].message
    assert cause in checks[check_id].message, checks[check_id].message
