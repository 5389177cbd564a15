"""Week 8: softmax over the last dimension in Triton, numerically stable (reference solution).

Two kernels, chosen by row length:
- a row of up to FUSED_MAX elements fits one block: one read, max, exp, sum, one write;
- a longer row is walked in blocks twice: the first pass keeps a running maximum and a running sum (online
  softmax), the second writes exp(x - max) / sum.
BACKEND = "cuda" sends softmax() to the CUDA C++ kernel in softmax_cuda.cu instead (GPU only).
"""
import functools
from pathlib import Path

import torch
import triton
import triton.language as tl

BACKEND = "triton"  # or "cuda": run the kernel in softmax_cuda.cu, built with torch.utils.cpp_extension
FUSED_MAX = 16384  # the longest row kept whole in registers by the one-pass kernel
ONLINE_BLOCK = 4096  # elements per step of the two-pass kernel


@triton.jit
def _softmax_fused_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: row * stride can pass 2^31 elements
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # -inf in the lanes past the end: it never wins the max, and exp(-inf) = 0 adds nothing to the sum
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    numerator = tl.exp(x - tl.max(x, axis=0))  # the largest exponent is 0: nothing overflows
    y = numerator / tl.sum(numerator, axis=0)
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_online_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    # Pass 1 reads the row once. Lane i keeps the maximum m_i of the values it has seen and d_i, the sum of
    # exp(x - m_i) over them; a new maximum rescales the old sum by exp(m_old - m_new).
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    d = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)  # a lane with only -inf so far keeps d = 0
        d = d * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    # Merge the lanes the same way: rescale each lane's sum to the row's maximum.
    row_max = tl.max(m, axis=0)
    inv_sum = 1.0 / tl.sum(d * tl.exp(m - row_max), axis=0)
    # Pass 2 reads the row again (from L2 while it fits there) and writes the result.
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_row + cols, (tl.exp(x - row_max) * inv_sum).to(y_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of x (fp32, fp16 or bf16; any shape and strides), in x's dtype."""
    if BACKEND == "cuda":
        return _cuda_extension().softmax(x)
    n_cols = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    # The kernels take any distance between rows but need a row's elements adjacent: view the input as
    # (rows, n_cols) and pack it only when the last dimension is strided (a transposed input, say).
    rows = x.reshape(-1, n_cols)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    out = y.view(-1, n_cols)
    grid = (rows.shape[0],)  # one program per row
    if n_cols <= FUSED_MAX:
        block = triton.next_power_of_2(n_cols)
        _softmax_fused_kernel[grid](rows, out, n_cols, rows.stride(0), out.stride(0), BLOCK=block,
                                    num_warps=min(max(block // 512, 4), 16))
    else:
        _softmax_online_kernel[grid](rows, out, n_cols, rows.stride(0), out.stride(0), BLOCK=ONLINE_BLOCK,
                                     num_warps=8)
    return y


@functools.cache
def _cuda_extension():
    """softmax_cuda.cu built into a Python module (torch caches the build until the source changes)."""
    from torch.utils.cpp_extension import load

    source = Path(__file__).with_name("softmax_cuda.cu")
    return load(name="infracourse_week08_softmax", sources=[str(source)], extra_cuda_cflags=["-O3"])
