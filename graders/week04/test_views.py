"""Week 4 views: predictions of view or copy, contiguity from strides, and views built with as_strided,
each verified through storage pointers and the ops the learner's function dispatched.

The learner's functions run in the grading worker. An output that is a view of an argument comes back as a
view of the judge's own tensor (the codec keeps aliasing when the storage's bytes match), so storage pointers
are compared here; the ops each call dispatched are what the worker observed (infracourse.grader.CallRecord)."""
import pytest
import torch

from infracourse.grader import CallRecord, LabCheckFailed, require_plain_tensor


# Every expression of PREDICTIONS, with the reason its answer is what it is (shown when a prediction is wrong).
REASONS = {
    "x.t()": "a transpose swaps two strides; no element moves",
    "x[:, 1:4]": "basic slicing moves the offset and keeps the strides",
    "x[::2, ::3]": "a step in a slice multiplies the stride",
    "x[[0, 2]]": "indexing with a list (advanced indexing) gathers the rows into new storage",
    "x[x > 5]": "a boolean mask selects a data-dependent set of elements: always new storage",
    "x.reshape(6, 4)": "reshape returns a view whenever strides can express the new shape, as they always can "
                       "for a contiguous tensor",
    "x.t().reshape(24)": "after a transpose the elements are not in storage order, so no single stride walks them "
                         "flat: reshape copies",
    "x.t().contiguous()": "the transpose is not contiguous, so .contiguous() copies it into row-major order",
    "x.contiguous()": "x is already contiguous, so .contiguous() returns x itself",
    "x.unsqueeze(0).expand(3, 4, 6)": "expand repeats with stride 0: nothing is copied",
    "x.float()": "x is already float32, so .float() returns x itself",
    "x.double()": "a new dtype needs new storage of the new element size",
    "x[:, ::2].flatten()": "every other element of each row of 6, row after row, is every other element of the "
                           "storage: one stride of 2 walks them, so flatten returns a view",
    "x[:, :3].flatten()": "the first 3 of each row of 6 cannot be walked flat with one stride: flatten copies",
    "x.unfold(1, 3, 2)": "unfold expresses overlapping windows with strides",
    "x.diagonal()": "the diagonal is every 7th element of the storage: one stride",
    "x.clone()": "clone always allocates new storage",
}
# ops a view built with as_strided may dispatch: the call itself and reads of metadata
AS_STRIDED_ONLY = frozenset({"as_strided", "size", "stride", "storage_offset", "numel", "sym_size", "sym_stride",
                             "sym_numel", "sym_storage_offset", "is_contiguous"})


@pytest.fixture(scope="module")
def views(learner):
    return learner.module("views")


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _watched(fn, *args):
    """Call a learner function in the worker, watched without poisoning: (output, ops it dispatched)."""
    result = fn.call(args, watch={"poison": False})
    record = CallRecord.from_evidence(result.record)
    return result.value, record.ops + record.profiled


@pytest.mark.check("views-predict")
def test_predictions(views):
    predictions = getattr(views, "PREDICTIONS", {})
    unfilled = [e for e in REASONS if predictions.get(e) not in ("view", "copy")]
    if unfilled:
        raise LabCheckFailed(f"PREDICTIONS: answer 'view' or 'copy' for {len(unfilled)} expression(s), e.g. "
                             f"{unfilled[:3]}")
    wrong = []
    for expression, reason in REASONS.items():
        x = torch.arange(24.0).reshape(4, 6)
        actual = "view" if _shares_storage(eval(expression, {"torch": torch}, {"x": x}), x) else "copy"
        if predictions[expression] != actual:
            wrong.append(f"{expression} is a {actual}: {reason}")
    if wrong:
        raise LabCheckFailed(f"{len(wrong)} of {len(REASONS)} predictions are wrong:\n  " + "\n  ".join(wrong))


def _layout_cases():
    base = torch.empty(4, 5, 6)
    return {
        "contiguous (4, 5, 6)": base, "transposed": base.transpose(0, 1), "sliced rows": base[:, 1:3],
        "every other column": base[..., ::2], "a size-1 slice": base[:, :1], "permuted": base.permute(2, 0, 1),
        "size-1 dims with odd strides": base[1:2, :, 0:1], "unsqueezed": base.unsqueeze(1),
        "expanded": base[:, None].expand(4, 3, 5, 6), "size-1 dims (3, 1, 4)": torch.empty(3, 1, 4),
        "empty (2, 0, 3)": torch.empty(2, 0, 3), "empty transposed": torch.empty(2, 0, 3).transpose(0, 2),
        "0-d": torch.empty(()), "1-d stepped": torch.empty(10)[::3], "a column": base[0, :, 2:3],
        "a transposed column (1, 5)": torch.empty(5, 1).t(), "a size-1 dim moved": base[0:1].transpose(0, 1),
    }


@pytest.mark.check("views-strides")
def test_strides(views):
    for what, t in _layout_cases().items():
        shape, stride = tuple(t.shape), tuple(t.stride())
        got_strides, ops = _watched(views.row_major_strides, shape)
        got, more_ops = _watched(views.is_row_major, shape, stride)
        if ops or more_ops:
            raise LabCheckFailed(f"row_major_strides / is_row_major dispatched torch ops {sorted(set(ops + more_ops))}: "
                                 "work from the numbers in shape and stride alone")
        want_strides = torch.empty(shape).stride()
        if tuple(got_strides) != want_strides:
            raise LabCheckFailed(f"row_major_strides({shape}) = {tuple(got_strides)}, expected {want_strides}")
        if bool(got) != t.is_contiguous():
            raise LabCheckFailed(
                f"is_row_major(shape={shape}, stride={stride}) for {what} is {got}, but torch says "
                f"{t.is_contiguous()}. A dim of size 1 is never stepped along, so its stride does not matter; "
                "a tensor with no elements is contiguous whatever its strides.")


def _require_view(out: torch.Tensor, x: torch.Tensor, expected: torch.Tensor, what: str, ops: list[str]):
    require_plain_tensor(out, like=expected, what=what)
    if not _shares_storage(out, x):
        raise LabCheckFailed(f"{what} has storage of its own: it is a copy. A view keeps x's storage and changes "
                             "only shape, strides and offset (no .contiguous(), .clone() or reshape that copies)")
    if out.stride() != expected.stride() or out.storage_offset() != expected.storage_offset():
        raise LabCheckFailed(f"{what}: strides {out.stride()} offset {out.storage_offset()}, expected "
                             f"{expected.stride()} offset {expected.storage_offset()}. as_strided's offset counts "
                             "from the start of the storage: pass x.storage_offset()")
    if not torch.equal(out, expected):
        raise LabCheckFailed(f"{what}: the values differ from the expected view")
    extra = sorted(set(ops) - AS_STRIDED_ONLY)
    if extra:
        raise LabCheckFailed(f"{what} dispatched {extra}: build the view with x.as_strided(...) alone")


@pytest.mark.check("views-transpose-no-copy")
def test_transpose_view(views):
    x = torch.randn(3, 4, 5)
    offset = torch.randn(6, 7, 8)[1:, ::2, 3:]  # non-contiguous and starting past the storage's first element
    cases = [(x, 0, 2), (x, -1, -2), (x, 1, 1), (offset, 0, 1), (offset, 2, 0), (torch.randn(5, 6).t(), 0, 1)]
    for t, d0, d1 in cases:
        what = f"transpose_view of a {tuple(t.shape)} tensor with strides {t.stride()}, dims ({d0}, {d1})"
        out, ops = _watched(views.transpose_view, t, d0, d1)
        _require_view(out, t, t.transpose(d0, d1), what, ops)


@pytest.mark.check("views-sliding-window")
def test_sliding_windows(views):
    ramp = torch.arange(20.0)
    strided = torch.arange(100.0)[7::3]  # stride 3, offset 7
    cases = [(ramp, 5, 2), (ramp, 3, 3), (ramp, 1, 1), (ramp, 20, 1), (ramp, 6, 7), (strided, 4, 3),
             (ramp[5:], 2, 1), (ramp, 21, 1), (ramp[:3], 5, 2)]
    for x, size, step in cases:
        what = f"sliding_windows(size={size}, step={step}) of {x.shape[0]} elements with stride {x.stride(0)}, " \
               f"offset {x.storage_offset()}"
        out, ops = _watched(views.sliding_windows, x, size, step)
        if size > x.shape[0]:  # no window fits: unfold refuses, the answer is an empty (0, size) tensor
            require_plain_tensor(out, shape=(0, size), dtype=x.dtype, device=x.device, what=what)
            continue
        _require_view(out, x, x.unfold(0, size, step), what, ops)
