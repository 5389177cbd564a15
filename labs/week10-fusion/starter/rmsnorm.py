"""Week 10: RMSNorm fused into one Triton kernel each way, forward and backward.

y = x / sqrt(mean(x^2) + eps) * weight over the last dimension. Fill in the kernels, the autograd Function
that launches them, and rms_norm. `infracourse grade week10` checks y, dx and dw against autograd of the
unfused ops, edge inputs, masks, that your kernels (not torch ops) did the work, your norm inside the
course's GPT, and on a GPU the operator's speed and, separately, the training step's.
Run `infracourse hint week10` if stuck.
"""
import os

import torch
import triton
import triton.language as tl

# On a machine without a GPU the grader sets TRITON_INTERPRET=1: the interpreter cannot autotune, so it
# gets one configuration. Upcast to fp32 right after every load (the interpreter computes wrongly on bf16
# values, and squares of fp16 values overflow anyway).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_COLS = 32768  # one row must fit in one program's registers


def _warps():
    return [triton.Config({}, num_warps=4)] if INTERPRET else [triton.Config({}, num_warps=w) for w in (4, 8, 16)]


@triton.autotune(configs=_warps(), key=["n_cols"])
@triton.jit
def _forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    # TODO(week10): one program per row. Load the row and the weight (which lanes past n_cols must not
    # load?), upcast to fp32, compute rstd = 1 / sqrt(mean(x^2) + eps), store rstd[row] and y = x * rstd * w.
    pass


@triton.autotune(configs=_warps(), key=["n_cols"])
@triton.jit
def _backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, n_rows, n_cols, rows_per_program,
                     stride_dy, stride_x, stride_dx, BLOCK: tl.constexpr):
    # TODO(week10): this program handles rows [pid * rows_per_program, ... + rows_per_program) (stop at n_rows).
    # Per row: x_hat = x * rstd, g = dy * w, dx = ? (derive it: y depends on x directly and through rstd).
    # Keep this program's share of dw = sum of dy * x_hat in fp32 and store it in row pid of dw_partial.
    pass


@triton.jit
def _column_sum_kernel(partial_ptr, out_ptr, n_rows, n_cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    # TODO(week10): out[c] = sum over r of partial[r, c], for this program's BLOCK_COLS columns, in fp32.
    pass


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        # TODO(week10): view x as (rows, n), allocate y and rstd (fp32, one per row) with torch.empty, launch
        # _forward_kernel over one program per row, ctx.save_for_backward what the backward needs.
        raise NotImplementedError("RMSNormFunction.forward: write _forward_kernel and launch it")

    @staticmethod
    def backward(ctx, dy):
        # TODO(week10): launch _backward_kernel over a few programs per SM (a handful under the interpreter),
        # then _column_sum_kernel over the partial dw; return (dx, dw, None): eps gets no gradient.
        raise NotImplementedError("RMSNormFunction.backward: write _backward_kernel and _column_sum_kernel")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension of x (fp32, fp16 or bf16); the result has x's dtype. Differentiable."""
    return RMSNormFunction.apply(x, weight, eps)
