"""Week 7: vector add and sum reduction as Triton kernels.

Fill in the two kernels and their wrappers. `infracourse grade week07` checks them on many sizes and
dtypes, on strided inputs, for reads and writes past the end, for fp32 accumulation, that your kernels
(not torch ops) computed the answers, and on a GPU their bandwidth. Run `infracourse hint week07` if stuck.
"""
import torch
import triton
import triton.language as tl

ADD_BLOCK = 1024
REDUCE_BLOCK = 4096


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # TODO(week07): compute this program's offsets, load x and y, add them, store into out.
    # The last program's block runs past n: what keeps it from touching memory it does not own?
    pass


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise x + y for tensors of the same shape and dtype (fp32, fp16 or bf16), any strides."""
    # TODO(week07): allocate the output with torch.empty_like and launch _add_kernel over enough programs.
    raise NotImplementedError("add(): write _add_kernel and launch it (see the TODOs in vector_ops.py)")


@triton.jit
def _partial_sum_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    # TODO(week07): each program sums its BLOCK elements (in fp32!) and writes one partial sum.
    pass


def reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of all elements of x, returned as a 0-d float32 tensor."""
    # TODO(week07): reduce to partial sums, then reduce the partials, until one value is left.
    raise NotImplementedError("reduce_sum(): write _partial_sum_kernel and the passes that use it")
