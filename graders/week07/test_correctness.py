"""Week 7 correctness: many sizes and dtypes, strided inputs, masks, fp32 accumulation, own kernels."""
import random

import pytest
import torch

from infracourse.grader import (LabCheckFailed, assert_close, explain_nan, fenced, interpreter_note,
                                require_plain_tensor, run_watched)


SIZES = [1, 127, 128, 129, 1023, 1025, 10**6]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def ops(learner):
    return learner.module("vector_ops")


def seeded_sizes(seed: int) -> list[int]:
    """Two sizes drawn per grade (on top of the fixed awkward ones): a kernel tuned to pass a fixed list fails
    some run; the seed is in every message, so a learner can replay it."""
    draw = random.Random(seed)
    return [draw.randrange(2, 5000), draw.randrange(5000, 300_000)]


def _pair(n, dtype, device):
    return torch.randn(n, device=device).to(dtype), torch.randn(n, device=device).to(dtype)


def _check_add(ops, x, y, what):
    out = run_watched(ops.add, x, y, name="add", require_kernel=False)
    require_plain_tensor(out, like=x, what=f"add output for {what}")
    try:
        assert_close(out, x.double() + y.double(), what=f"add for {what}")
    except LabCheckFailed as exc:
        raise LabCheckFailed(f"{exc}.{interpreter_note(x.dtype)}") from None


def _check_sum(ops, x, what):
    out = run_watched(ops.reduce_sum, x, name="reduce_sum", require_kernel=False)
    require_plain_tensor(out, shape=(), dtype=torch.float32, device=x.device,
                         what=f"reduce_sum result for {what} (a 0-d float32 tensor: the fp32 accumulator)")
    ref = x.double().sum()
    bound = 1e-5 * x.double().abs().sum().item() + 1e-6
    err = abs(out.item() - ref.item())
    if not err <= bound:
        raise LabCheckFailed(f"reduce_sum for {what}: got {out.item():.8g}, expected {ref.item():.8g} "
                             f"(error {err:.3g} > allowed {bound:.3g})")


@pytest.mark.check("add-correct")
def test_add_correct(ops, device, seed):
    for dtype in DTYPES:
        for n in SIZES + seeded_sizes(seed):
            x, y = _pair(n, dtype, device)
            _check_add(ops, x, y, f"n={n} {dtype} (seed {seed})")


@pytest.mark.check("add-noncontiguous")
def test_add_noncontiguous(ops, device, seed):
    for dtype in DTYPES:
        base = torch.randn(2, 2200, device=device).to(dtype)
        square = base[0, :2145].view(33, 65)
        cases = {"every other element x[::2]": (base[0, ::2], base[1, ::2]),
                 "transposed 33x65": (square.t(), base[1, :2145].view(33, 65).t()),
                 "column slice": (base[:, 7:1032], base[:, 900:1925]),
                 # one operand contiguous and the other not: each operand's layout is its own
                 "x contiguous, y every other element": (base[0, :1100].clone(), base[1, ::2]),
                 "x every other element, y contiguous": (base[0, ::2], base[1, :1100].clone()),
                 "x contiguous 65x33, y transposed 33x65": (square.t().contiguous(), base[1, :2145].view(33, 65).t()),
                 "x transposed, y a column slice": (base[:, :2].t(), base[:2, 1000:1002])}
        for what, (x, y) in cases.items():
            _check_add(ops, x, y, f"{what} {dtype} (seed {seed})")


@pytest.mark.check("reduce-correct")
def test_reduce_correct(ops, device, seed):
    for dtype in DTYPES:
        for n in [0] + SIZES + seeded_sizes(seed):
            x = torch.randn(n, device=device).to(dtype)
            _check_sum(ops, x, f"n={n} {dtype} (seed {seed})")
        x = torch.randn(37, 41, device=device).to(dtype).t()
        _check_sum(ops, x, f"a transposed 41x37 {dtype}")


@pytest.mark.check("reduce-accuracy")
def test_reduce_accuracy(ops, device, record):
    # All-positive values: every partial sum grows, so an fp16/bf16 accumulator loses digits visibly.
    n = 10**6
    worst = 0.0
    for dtype in DTYPES:
        x = torch.rand(n, device=device).to(dtype)
        ref = x.double().sum().item()
        got = run_watched(ops.reduce_sum, x, name="reduce_sum", require_kernel=False).item()
        rel = abs(got - ref) / ref
        worst = max(worst, rel)
        if rel > 1e-5:
            raise LabCheckFailed(
                f"reduce_sum of 10^6 values in [0, 1) as {dtype}: relative error {rel:.2e} > 1e-5. fp32 accumulation "
                f"gives about 1e-7; an error this large means partial sums are kept in {dtype} or fewer digits. "
                "Upcast with .to(tl.float32) before summing.")
    record("relative error", worst, target=1e-5, unit="")


@pytest.mark.check("masks")
def test_masks(ops, device):
    # Inputs sit between NaN fences, outputs between canaries: an unmasked load reads NaN into the
    # result and an unmasked store changes a canary.
    for n in [1, 129, 1025, 4097]:
        x, y = (fenced(t) for t in _pair(n, torch.float32, device))
        out = run_watched(ops.add, x, y, name="add", require_kernel=False)
        if torch.isnan(out).any():
            explain_nan(ops.add, (x, y), name="add", what=f"add at n={n}",
                        never_written="Launch triton.cdiv(n, BLOCK) programs so the last, partial block is covered, "
                                      "and store every lane below n.",
                        past_end="Pass mask=offsets < n to every tl.load.")
        assert_close(out, x.double() + y.double(), what=f"add at n={n}")
        total = run_watched(ops.reduce_sum, x, name="reduce_sum", require_kernel=False)
        if torch.isnan(total):
            raise LabCheckFailed(f"reduce_sum at n={n} is NaN: it read past the end of the input. "
                                 "Load with mask=offsets < n and other=0.0.")


@pytest.mark.check("kernel-did-work")
def test_kernel_did_work(ops, device):
    x, y = _pair(4097, torch.float32, device)
    run_watched(ops.add, x, y, name="add", replaces="torch.add")
    run_watched(ops.reduce_sum, x, name="reduce_sum", replaces="torch.sum")


@pytest.mark.check("add-large")
def test_add_large(ops, device):
    for dtype in (torch.float32, torch.float16):
        x, y = _pair(2**26 + 3, dtype, device)
        _check_add(ops, x, y, f"n=2^26+3 {dtype}")
