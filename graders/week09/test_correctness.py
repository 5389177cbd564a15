"""Week 9 correctness: odd shapes, three dtypes, strided inputs, the fp32 accumulator, masks, own kernel."""
import random

import pytest
import torch

from infracourse.grader import (LabCheckFailed, dtype_name, explain_nan, fenced, interpreter_note,
                                relative_error, require_plain_tensor, run_watched, wrong_blocks)


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (M, K, N): C is M x N. Sizes that do not divide any tile, 1x1x1, K = 1, a row vector times a matrix,
# skinny M (decode-like), and one tile-aligned case.
SHAPES = [(1, 1, 1), (33, 33, 33), (45, 33, 40), (64, 64, 64), (3, 257, 130), (1, 300, 70), (100, 1, 100),
          (130, 65, 97)]


def product_error(mm, a, b, what, with_output=False):
    """Run the learner's matmul watched; the relative error of a plain, NaN-free output against a @ b."""
    out = run_watched(mm.matmul, a, b, name="matmul", require_kernel=False)
    require_plain_tensor(out, shape=(a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device,
                         what=f"matmul output for {what}")
    if torch.isnan(out).any():
        explain_nan(mm.matmul, (a, b), name="matmul", what=f"matmul for {what}",
                    never_written="Launch a program for every tile, cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N), and store "
                                  "each tile's edge elements.",
                    past_end="Mask the K tail (other=0.0) and the M/N edges of every load of A and B.")
    err = relative_error(out, a.double() @ b.double())
    return (err, out) if with_output else err


def check_product(mm, a, b, bound, what):
    """Fail unless the learner's a @ b is within `bound`, saying what an error of this size usually means."""
    err, out = product_error(mm, a, b, what, with_output=True)
    if not err <= bound:
        blocks = wrong_blocks(out, a.double() @ b.double())
        if blocks:
            advice = blocks
        elif err > 0.05:
            advice = "the values are wrong, not imprecise: check the tile indexing, the strides and the K loop"
        else:
            advice = ("precision is lost: accumulate in fp32 (tl.zeros(..., dtype=tl.float32)), never round the "
                      "tiles to a narrower dtype, and round the result once, at the store")
            if a.dtype == torch.float32 and a.is_cuda and not torch.backends.cuda.matmul.allow_tf32:
                advice += (". tf32 tensor cores give 3e-4 to 1e-3: torch.backends.cuda.matmul.allow_tf32 is False, "
                           "so compute fp32 in full precision, tl.dot(..., input_precision='ieee')")
        raise LabCheckFailed(f"matmul for {what}: relative error {err:.2e} > {bound:.0e} allowed for "
                             f"{dtype_name(a.dtype)}; {advice}.{interpreter_note(a.dtype)}")
    return err


@pytest.mark.check("correct")
def test_correct(mm, device, seed, error_bound, record):
    worst = {}
    draw = random.Random(seed)  # two shapes drawn per grade, on top of the fixed awkward ones
    drawn = [(draw.randrange(1, 150), draw.randrange(1, 300), draw.randrange(1, 150)) for _ in range(2)]
    for dtype in DTYPES:
        for M, K, N in SHAPES + drawn:
            a = torch.randn(M, K, device=device).to(dtype)
            b = torch.randn(K, N, device=device).to(dtype)
            err = check_product(mm, a, b, error_bound(dtype), f"({M}x{K}) @ ({K}x{N}) {dtype_name(dtype)} (seed {seed})")
            worst[dtype] = max(worst.get(dtype, 0.0), err)
    for dtype, err in worst.items():
        record(f"relative error {dtype_name(dtype)}", err, target=error_bound(dtype))


@pytest.mark.check("strided")
def test_strided(mm, device, seed, error_bound):
    for dtype in DTYPES:
        base = torch.randn(160, 160, device=device).to(dtype)
        cases = {
            "B transposed (a weight stored N x K, as nn.Linear keeps it)": (base[:45, :70], base[:33, 70:140].t()),
            "A transposed": (base[:70, :45].t(), base[:70, 50:83]),
            "both transposed": (base[:70, :45].t(), base[100:133, :70].t()),
            "sub-blocks of a larger matrix (row stride > K)": (base[5:50, 3:73], base[80:150, 90:123]),
            "every other column": (base[:45, ::2][:, :70], base[:70, 1::2][:, :33]),
        }
        for what, (a, b) in cases.items():
            check_product(mm, a, b, error_bound(dtype), f"{what}, {dtype_name(dtype)} (seed {seed})")


@pytest.mark.check("accumulator")
def test_accumulator(mm, device, record, error_bound):
    # All-positive inputs and a long K: every partial sum grows to about K / 4 = 1024, where an fp16
    # accumulator keeps steps of 1 (up to 0.5 of error at every K tile) and an fp32 one steps of 6e-5.
    worst = 0.0
    for dtype in DTYPES:
        a = torch.rand(40, 4096, device=device).to(dtype)
        b = torch.rand(4096, 24, device=device).to(dtype)
        err = product_error(mm, a, b, f"(40x4096) @ (4096x24) all-positive {dtype_name(dtype)} inputs")
        if not err <= error_bound(dtype):
            raise LabCheckFailed(
                f"matmul of (40x4096) @ (4096x24) all-positive {dtype_name(dtype)} inputs: relative error {err:.2e} > "
                f"{error_bound(dtype):.0e}. The output's own rounding stays well inside that bound; this much "
                "means the K partial sums are kept in fp16/bf16. Accumulate in "
                "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) and round once, at the store.")
        worst = max(worst, err / error_bound(dtype))
    record("worst error / bound", worst, target=1.0)


@pytest.mark.check("masks")
def test_masks(mm, device, error_bound):
    # Inputs sit between NaN fences and outputs between canaries: an unmasked load past the end of A or B
    # reads NaN into C, an unmasked store past the edge of C changes a canary.
    for M, K, N in [(45, 33, 40), (33, 70, 1), (130, 65, 97), (1, 45, 200)]:
        a = fenced(torch.randn(M, K, device=device))
        b = fenced(torch.randn(K, N, device=device))
        check_product(mm, a, b, error_bound(torch.float32), f"({M}x{K}) @ ({K}x{N}) fp32 with fenced inputs")


@pytest.mark.check("kernel-did-work")
def test_kernel_did_work(mm, device):
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(64, 96, device=device).to(dtype)
        b = torch.randn(96, 80, device=device).to(dtype)
        run_watched(mm.matmul, a, b, name="matmul", replaces="torch.mm / torch.matmul (cuBLAS)")


@pytest.mark.check("correct-large")
def test_correct_large(mm, seed, error_bound):
    # the tile sizes the autotuner picks on a GPU, on shapes that divide none of them
    for M, K, N, dtype in [(2049, 3000, 1531, torch.float16), (8, 8192, 8192, torch.bfloat16),
                           (8192, 72, 4100, torch.bfloat16), (1000, 1000, 1000, torch.float32)]:
        a = torch.randn(M, K, device="cuda").to(dtype)
        b = torch.randn(K, N, device="cuda").to(dtype)
        check_product(mm, a, b, error_bound(dtype), f"({M}x{K}) @ ({K}x{N}) {dtype_name(dtype)} (seed {seed})")


@pytest.mark.check("fp32-precision")
def test_fp32_precision(mm, record, error_bound, tf32):
    a = torch.randn(512, 1024, device="cuda")
    b = torch.randn(1024, 384, device="cuda")
    for allow in (False, True):  # the fp32_is_ieee fixture puts torch's default back for the next check
        tf32(allow)
        mode = "tf32 allowed" if allow else "tf32 not allowed (torch's default: ieee fp32)"
        err = check_product(mm, a, b, error_bound(torch.float32), f"(512x1024) @ (1024x384) fp32, {mode}")
        record(f"relative error fp32 {'tf32' if allow else 'ieee'}", err, target=error_bound(torch.float32))
