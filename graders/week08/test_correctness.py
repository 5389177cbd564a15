"""Week 8 correctness: row lengths, dtypes, long rows, extreme values, strides, masks (CPU-sized)."""
import random

import pytest
import torch

from infracourse.grader import LabCheckFailed, explain_nan, fenced, run_watched


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Row lengths around powers of two, odd ones, and 16385 (one past 2^14, where many kernels change strategy).
ROW_LENGTHS = [1, 7, 127, 128, 129, 1000, 1025, 4096, 5000, 16385]
LONG = 2**20 + 3  # more than the 2^20 elements Triton allows in one block: the row must be walked in a loop


@pytest.mark.check("correct")
def test_correct(graded, device, seed):
    for dtype in DTYPES:
        for n in ROW_LENGTHS:
            rows = 3 if n <= 5000 else 2
            x = torch.randn(rows, n, device=device).to(dtype)
            graded(x, f"shape {tuple(x.shape)} {dtype} (seed {seed})")
        # drawn per grade, on top of the fixed lengths: a kernel tuned to a fixed list fails some run
        draw = random.Random(f"{seed}-{dtype}")
        rows, n = draw.randrange(1, 9), draw.choice([draw.randrange(2, 4096), draw.randrange(4096, 40000)])
        graded(torch.randn(rows, n, device=device).to(dtype), f"shape ({rows}, {n}) {dtype}, drawn for seed {seed}")
        graded(torch.randn(300, device=device).to(dtype), f"a 1-D input of 300 {dtype}")
        graded(torch.randn(2, 3, 77, device=device).to(dtype), f"a 2x3x77 input {dtype}")
        for shape in [(0, 7), (3, 0)]:
            graded(torch.randn(shape, device=device).to(dtype), f"the empty shape {shape} {dtype}")


@pytest.mark.check("long-rows")
def test_long_rows(graded, device, seed):
    cases = {
        f"one row of {LONG} fp32": torch.randn(1, LONG, device=device),
        # the maximum arrives in the last block: every earlier partial sum must be rescaled
        "a row of 300007 rising to its maximum at the end": torch.linspace(-30, 30, 300007, device=device)[None],
        # the maximum in the first block and a long tail of small values
        "two rows of 70001 fp16 falling from their maximum": torch.linspace(8, -8, 70001, device=device).expand(2, -1)
        .to(torch.float16).contiguous(),
        "two rows of 131072 bf16": torch.randn(2, 131072, device=device).to(torch.bfloat16),
    }
    for what, x in cases.items():
        try:
            graded(x, f"{what} (seed {seed})")
        except LabCheckFailed:
            raise
        except Exception as exc:
            if "numel" in str(exc):
                raise LabCheckFailed(
                    f"softmax on {what}: {exc}. A Triton block holds at most 2^20 elements (and far fewer fit in "
                    "registers): walk a long row in blocks with a loop and keep a running max and sum "
                    "(online softmax).") from None
            raise


@pytest.mark.check("stability")
def test_stability(graded, device, seed):
    base = torch.randn(4, 3000, device=device)
    masked = torch.randn(4, 3000, device=device)
    masked[masked < 0.8] = -float("inf")  # attention-style masking: most entries -inf
    masked[:, 0] = 1.0  # every row keeps one finite value
    one_hot = torch.full((2, 1500), -float("inf"), device=device)
    one_hot[0, 17], one_hot[1, 1499] = 3.0, -2.0
    cases = {
        "fp32 values around +10^4 (exp overflows without subtracting the max)": base + 1e4,
        "fp32 values around -10^4 (exp underflows to 0/0 without it)": base - 1e4,
        "fp32 values spread by 10^3": base * 1e3,
        "fp16 values near its limit of 65504": (base * 2e4).clamp(-65000, 65000).to(torch.float16),
        "bf16 values of order 10^30": (base * 1e30).to(torch.bfloat16),
        "rows with -inf (masked) entries": masked,
        "rows that are -inf except one value": one_hot,
        "rows of equal values": torch.full((3, 999), 7.5, device=device),
        # below -88 every exp(x) underflows to 0: only a maximum that starts at -inf (and a sum rescaled
        # from it) keeps 0/0 out; a running maximum started at 0 or any finite value gives NaN here
        "rows of -1000 (every exp(x) underflows fp32)": torch.full((3, 999), -1000.0, device=device),
        "two long rows of 40000 around +10^4": torch.randn(2, 40000, device=device) * 100 + 1e4,
        "two long rows of 40000 around -10^4": torch.randn(2, 40000, device=device) * 100 - 1e4,
        "a long row of 300007 values of -1000": torch.full((1, 300007), -1000.0, device=device),
        "two long rows of 40000 with -inf entries": masked.repeat(1, 14)[:2, :40000],
    }
    for what, x in cases.items():
        graded(x, f"{what} (seed {seed})")


@pytest.mark.check("noncontiguous")
def test_noncontiguous(graded, device, seed):
    for dtype in DTYPES:
        base = torch.randn(16, 1100, device=device).to(dtype)
        cases = {
            "a transposed 16x33 (columns become rows: the last dimension has stride 1100)": base[:, :33].t(),
            "every other row, x[::2]": base[::2, :1000],
            "a column slice, x[:, 5:1030]": base[:, 5:1030],
            "a permuted 4x50x6 -> 4x6x50": base[:4, :300].reshape(4, 50, 6).permute(0, 2, 1),
            "one row broadcast to 5 (row stride 0)": base[:1, :300].expand(5, 300),
        }
        for what, x in cases.items():
            graded(x, f"{what} {dtype} (seed {seed})")


@pytest.mark.check("masks")
def test_masks(softmax, expect, device):
    # Inputs sit between NaN fences and outputs between canaries: an unmasked load picks up NaN (or the next
    # row's values), an unmasked store changes a canary.
    for shape in [(1, 5), (3, 129), (2, 1000), (4, 1025), (2, 20001)]:
        x = fenced(torch.randn(shape, device=device))
        expected = torch.softmax(x.double(), dim=-1)
        out = run_watched(softmax, x, name="softmax", require_kernel=False)
        if torch.isnan(out).any():
            explain_nan(softmax, (x,), name="softmax", what=f"softmax at shape {shape}",
                        never_written="Launch one program per row (or cover every row with your loop) and store "
                                      "every column below n_cols, the last partial block included.",
                        past_end="Pass mask=cols < n_cols to every tl.load, with other=-float('inf').")
        expect(out, x, expected, f"shape {shape} between NaN fences")
