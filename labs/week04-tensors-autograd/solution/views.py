"""Week 4, part 1: strides, views and copies.

A tensor is a storage (a flat buffer) plus a shape, strides and an offset saying where each element
lives in it. A view is a new shape/stride/offset over the same storage; a copy has storage of its own.
"""
import torch

# For x = torch.arange(24.).reshape(4, 6): is each result a view of x's storage ("view") or a tensor
# with storage of its own ("copy")?
PREDICTIONS = {
    "x.t()": "view",
    "x[:, 1:4]": "view",
    "x[::2, ::3]": "view",
    "x[[0, 2]]": "copy",
    "x[x > 5]": "copy",
    "x.reshape(6, 4)": "view",
    "x.t().reshape(24)": "copy",
    "x.t().contiguous()": "copy",
    "x.contiguous()": "view",
    "x.unsqueeze(0).expand(3, 4, 6)": "view",
    "x.float()": "view",
    "x.double()": "copy",
    "x[:, ::2].flatten()": "view",
    "x[:, :3].flatten()": "copy",
    "x.unfold(1, 3, 2)": "view",
    "x.diagonal()": "view",
    "x.clone()": "copy",
}


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a contiguous tensor of this shape."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)  # as torch does: an empty dim does not zero the strides before it
    return tuple(reversed(strides))


def is_row_major(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when (shape, stride) lays the elements out contiguously in row-major order."""
    if 0 in shape:
        return True  # no elements: any strides describe them
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1 and step != expected:  # a size-1 dim is never stepped along: its stride is irrelevant
            return False
        expected *= size
    return True


def transpose_view(x: torch.Tensor, dim0: int, dim1: int) -> torch.Tensor:
    """x with dims dim0 and dim1 swapped, as a view built with as_strided alone."""
    size, stride = list(x.shape), list(x.stride())
    size[dim0], size[dim1] = size[dim1], size[dim0]
    stride[dim0], stride[dim1] = stride[dim1], stride[dim0]
    # as_strided's offset counts from the start of the storage, not from x: pass x's own offset on
    return x.as_strided(size, stride, x.storage_offset())


def sliding_windows(x: torch.Tensor, size: int, step: int) -> torch.Tensor:
    """All windows x[i*step : i*step + size] of a 1-D tensor, as a (n_windows, size) view of x."""
    count = max((x.shape[0] - size) // step + 1, 0)
    return x.as_strided((count, size), (step * x.stride(0), x.stride(0)), x.storage_offset())
