"""Week 4, part 1: strides, views and copies.

A tensor is a storage (a flat buffer) plus a shape, strides and an offset saying where each element
lives in it. A view is a new shape/stride/offset over the same storage; a copy has storage of its own.
"""
import torch

# For x = torch.arange(24.).reshape(4, 6): is each result a view of x's storage ("view") or a tensor
# with storage of its own ("copy")? TODO(week04): replace every TODO with "view" or "copy".
PREDICTIONS = {
    "x.t()": "TODO",
    "x[:, 1:4]": "TODO",
    "x[::2, ::3]": "TODO",
    "x[[0, 2]]": "TODO",
    "x[x > 5]": "TODO",
    "x.reshape(6, 4)": "TODO",
    "x.t().reshape(24)": "TODO",
    "x.t().contiguous()": "TODO",
    "x.contiguous()": "TODO",
    "x.unsqueeze(0).expand(3, 4, 6)": "TODO",
    "x.float()": "TODO",
    "x.double()": "TODO",
    "x[:, ::2].flatten()": "TODO",
    "x[:, :3].flatten()": "TODO",
    "x.unfold(1, 3, 2)": "TODO",
    "x.diagonal()": "TODO",
    "x.clone()": "TODO",
}


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a contiguous tensor of this shape."""
    # TODO(week04): from the numbers alone, no tensor.
    raise NotImplementedError("row_major_strides(): compute the strides of a contiguous tensor")


def is_row_major(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when (shape, stride) lays the elements out contiguously in row-major order."""
    # TODO(week04): what about dims of size 1, and tensors with no elements?
    raise NotImplementedError("is_row_major(): decide contiguity from shape and stride")


def transpose_view(x: torch.Tensor, dim0: int, dim1: int) -> torch.Tensor:
    """x with dims dim0 and dim1 swapped, as a view built with as_strided alone."""
    # TODO(week04): x.as_strided(size, stride, storage_offset); no transpose, no copy.
    raise NotImplementedError("transpose_view(): swap two dims with as_strided")


def sliding_windows(x: torch.Tensor, size: int, step: int) -> torch.Tensor:
    """All windows x[i*step : i*step + size] of a 1-D tensor, as a (n_windows, size) view of x."""
    # TODO(week04): one as_strided call; x may be strided and start past its storage's first element.
    raise NotImplementedError("sliding_windows(): build the windows with as_strided")
