"""Week 7: vector add and sum reduction as Triton kernels (reference solution)."""
import torch
import triton
import triton.language as tl

ADD_BLOCK = 1024
REDUCE_BLOCK = 4096


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n  # the last block may run past n: those lanes neither load nor store
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    assert x.shape == y.shape and x.dtype == y.dtype and x.device == y.device
    # The kernel walks memory linearly, so strided views are packed first (a copy, not a computation).
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        _add_kernel[(triton.cdiv(n, ADD_BLOCK),)](x, y, out, n, BLOCK=ADD_BLOCK)
    return out


@triton.jit
def _partial_sum_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # other=0.0 makes masked-off lanes neutral for the sum; accumulate in fp32 whatever the input dtype
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + tl.program_id(0), tl.sum(x, axis=0))


def reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of all elements as a 0-d float32 tensor (the fp32 accumulator, not rounded back to x.dtype)."""
    x = x.contiguous().view(-1)
    # Each pass turns n values into cdiv(n, BLOCK) fp32 partial sums until one is left: a tree of blocks,
    # whose rounding error grows with log(n) rather than n.
    while True:
        n = x.numel()
        partial = torch.empty(max(triton.cdiv(n, REDUCE_BLOCK), 1), dtype=torch.float32, device=x.device)
        _partial_sum_kernel[(partial.numel(),)](x, partial, n, BLOCK=REDUCE_BLOCK)
        if partial.numel() == 1:
            return partial.view(())
        x = partial
