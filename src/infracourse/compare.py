"""The one comparison helper: learner output against a reference, with tolerances per dtype.

The reference is computed in float64 on a private copy of the inputs. Tolerances are tight enough that
doing the arithmetic in a lower precision than the dtype asks for fails: fp32 work done in fp16 misses
the fp32 bound by orders of magnitude. NaN and inf must appear at the same positions as the reference's.
"""
from __future__ import annotations

from typing import Any

from infracourse.failures import LabCheckFailed

# (rtol, atol) per output dtype, for elementwise ops whose reference is exact in float64.
TOLERANCES = {
    "torch.float64": (1e-10, 1e-12),
    "torch.float32": (1e-5, 1e-6),
    "torch.float16": (1e-2, 1e-3),
    "torch.bfloat16": (2e-2, 1e-2),
}


def tolerance(dtype: Any) -> tuple[float, float]:
    try:
        return TOLERANCES[str(dtype)]
    except KeyError:
        raise ValueError(f"no tolerance defined for {dtype}") from None


def assert_close(actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None,
                 what: str = "output") -> None:
    """Fail with a teaching message when `actual` differs from `expected` beyond the dtype's tolerance.

    `expected` may be float64; the comparison is made in float64 and the bounds come from actual's dtype.
    """
    import torch

    default_rtol, default_atol = tolerance(actual.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if tuple(actual.shape) != tuple(expected.shape):
        raise LabCheckFailed(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    # float64 on the output's own device: a GPU compares a 2^26-element output in milliseconds, not seconds
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(a.device, torch.float64)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        where = torch.nonzero(nan_a != nan_e)[0].tolist()
        raise LabCheckFailed(f"{what}: NaN at different positions than the reference, first at index {where} "
                             f"(yours {a[tuple(where)].item()}, reference {e[tuple(where)].item()})")
    inf_a, inf_e = torch.isinf(a), torch.isinf(e)
    if not torch.equal(inf_a, inf_e) or not torch.equal(a[inf_a], e[inf_e]):
        where = torch.nonzero((inf_a != inf_e) | (inf_a & (a != e)))[0].tolist()
        raise LabCheckFailed(f"{what}: infinities differ from the reference, first at index {where}")
    finite = ~(nan_a | inf_a)
    err = (a - e).abs()
    bound = atol + rtol * e.abs()
    bad = (err > bound) & finite
    if bad.any():
        idx = tuple(torch.nonzero(bad)[0].tolist())
        raise LabCheckFailed(
            f"{what}: {int(bad.sum())} of {a.numel()} elements out of tolerance (rtol={rtol:g}, atol={atol:g} for "
            f"{actual.dtype}); first at index {list(idx)}: yours {a[idx].item():.6g}, reference {e[idx].item():.6g}, "
            f"max abs error {err[finite].max().item():.3g}" + _located(actual, expected))


def wrong_blocks(actual: Any, expected: Any) -> str:
    """Where the grossly wrong elements (off by more than a tenth of the reference's rms) sit, when only part of
    the output is wrong: a program's block or row skipped, stored in the wrong place or computed from the wrong
    part of an input. Empty when nothing is grossly wrong or everything is (precision, or the formula itself)."""
    import torch

    a = actual.detach().to(torch.float64)
    e = expected.detach().to(a.device, torch.float64)
    if a.dim() == 0 or a.shape != e.shape or not a.numel():
        return ""
    a, e = a.reshape(-1, a.shape[-1]), e.reshape(-1, e.shape[-1])  # rows x the last dimension
    finite = torch.isfinite(e)
    scale = e[finite].pow(2).mean().sqrt().item() if finite.any() else 0.0
    bad = ~((a - e).abs() <= 0.1 * (scale or 1.0)) & finite  # NaN in yours counts as wrong
    if not bad.any() or bad[finite].all():
        return ""
    rows, cols = bad.nonzero().unbind(1)
    r0, r1, c0, c1 = rows.min().item(), rows.max().item(), cols.min().item(), cols.max().item()
    box = (r1 - r0 + 1) * (c1 - c0 + 1)
    if box == bad.numel() or int(bad.sum()) < box // 2:  # spread over the whole output, or scattered: no block
        return ""
    where = f"elements {c0}-{c1}" if a.shape[0] == 1 else f"rows {r0}-{r1}, columns {c0}-{c1}"
    return (f"the large errors lie in {where} while the rest of the output is right: a block or row was skipped, "
            "stored in the wrong place or computed from the wrong part of an input (grid size, indexing, strides, "
            "loop bounds), not a precision problem")


def relative_error(actual: Any, expected: Any) -> float:
    """||actual - expected|| / ||expected|| in float64 (0 when both are zero)."""
    import torch

    a = actual.detach().to(torch.float64)
    e = expected.detach().to(a.device, torch.float64)
    denominator = torch.linalg.vector_norm(e).item()
    numerator = torch.linalg.vector_norm(a - e).item()
    return numerator / denominator if denominator else numerator


# Per-element bound for gradients, as a fraction of (|reference| + the rms of the reference's row): elements that
# cancel to near zero (dx of a norm) are judged on their row's scale. fp16/bf16 gradients carry their own rounding.
GRADIENT_TOLERANCES = {"torch.float32": 1e-5, "torch.float16": 4e-3, "torch.bfloat16": 2e-2}


def assert_grad_close(actual: Any, expected: Any, *, what: str, hint: str = "") -> None:
    """Every element of a gradient within GRADIENT_TOLERANCES[dtype] x (|reference| + rms of its row)."""
    import torch

    a = actual.detach().to(torch.float64)
    e = expected.detach().to(a.device, torch.float64)
    if not torch.isfinite(a).all():
        raise LabCheckFailed(f"{what}: NaN or inf in your gradient (the reference is finite): a load past the end "
                             "of a row, an element never written, or squares overflowing below fp32")
    if str(actual.dtype) not in GRADIENT_TOLERANCES:
        raise LabCheckFailed(f"{what}: a {actual.dtype} gradient; return it in its input's dtype (fp32, fp16 or bf16)")
    bound = GRADIENT_TOLERANCES[str(actual.dtype)] * (e.abs() + e.pow(2).mean(-1, keepdim=True).sqrt())
    bad = (a - e).abs() > bound
    if bad.any():
        where = tuple(torch.nonzero(bad)[0].tolist())
        raise LabCheckFailed(
            f"{what}: {int(bad.sum())} of {a.numel()} elements off (relative error {relative_error(a, e):.2e}); first "
            f"at index {list(where)}: yours {a[where].item():.6g}, reference {e[where].item():.6g}"
            f"{_located(actual, expected)}. {hint}".strip())


def _located(actual: Any, expected: Any) -> str:
    blocks = wrong_blocks(actual, expected)
    return f". {blocks[0].upper()}{blocks[1:]}" if blocks else ""
