"""Week 8: softmax over the last dimension, numerically stable, in Triton.

softmax(x)[..., j] = exp(x[..., j]) / sum_k exp(x[..., k]), computed one row at a time. Fill in the two
kernels and the wrapper. `infracourse grade week08` checks many row lengths and dtypes, rows longer than a
Triton block, extreme values, strided inputs, reads and writes past the end, that your kernels (not torch)
computed the answer, and on a GPU the bandwidth and the speed against torch.softmax. `infracourse hint week08`
if stuck.

To take the CUDA C++ route instead, set BACKEND = "cuda" and write the kernel in softmax_cuda.cu.
"""
import functools
from pathlib import Path

import torch
import triton
import triton.language as tl

BACKEND = "triton"  # or "cuda": run the kernel in softmax_cuda.cu, built with torch.utils.cpp_extension
FUSED_MAX = 16384  # the longest row your one-pass kernel keeps whole in one block (tune it on a GPU)
ONLINE_BLOCK = 4096  # elements per step of the kernel for longer rows


@triton.jit
def _softmax_fused_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    # TODO(week08): one program per row: load the whole row (BLOCK >= n_cols) in fp32, subtract its maximum,
    # exponentiate, divide by the sum, store in y's dtype. What must the lanes past n_cols load so that they
    # change neither the maximum nor the sum?
    pass


@triton.jit
def _softmax_online_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    # TODO(week08): a row longer than one block. First loop over the row in steps of BLOCK keeping a running
    # maximum m and a running sum d of exp(x - m) (rescale d when m grows), then a second loop that writes
    # exp(x - max) / sum.
    pass


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of x (fp32, fp16 or bf16; any shape and strides), in x's dtype."""
    if BACKEND == "cuda":
        return _cuda_extension().softmax(x)
    # TODO(week08): allocate the output with torch.empty, view the input as (rows, n_cols), and launch one
    # program per row: the fused kernel for rows up to FUSED_MAX, the online kernel for longer ones.
    raise NotImplementedError("softmax(): write the kernels and launch them (see the TODOs in softmax.py)")


@functools.cache
def _cuda_extension():
    """softmax_cuda.cu built into a Python module (torch caches the build until the source changes)."""
    from torch.utils.cpp_extension import load

    source = Path(__file__).with_name("softmax_cuda.cu")
    return load(name="infracourse_week08_softmax", sources=[str(source)], extra_cuda_cflags=["-O3"])
