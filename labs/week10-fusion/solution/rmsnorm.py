"""Week 10: RMSNorm fused into one Triton kernel each way, forward and backward (reference solution).

y = x / sqrt(mean(x^2) + eps) * weight over the last dimension. Unfused, torch runs one kernel per op (square,
mean, add, rsqrt, two multiplies) and writes every intermediate to memory; fused, each row is read once
and written once.
"""
import os

import torch
import triton
import triton.language as tl

# On a machine without a GPU the grader sets TRITON_INTERPRET=1: the interpreter cannot autotune, so it
# gets one configuration. Every kernel upcasts to fp32 right after loading (the interpreter computes wrongly
# on bf16 values, and squares of fp16 values overflow anyway).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_COLS = 32768  # one row must fit in one program's registers


TUNED_COLS = 2048  # rows longer than this pick their warps by autotuning; shorter ones use 4 warps untuned
WARPS = [triton.Config({}, num_warps=w) for w in (4, 8, 16)]


def _launcher(kernel):
    """launch(grid, n_cols, *args): the kernel autotuned over WARPS for long rows on a GPU, else plain with 4
    warps. The autotuner benchmarks every new key, even one a prune leaves a single configuration (~0.1-1 s
    each), so short rows, with nothing to tune, skip it; the interpreter cannot tune at all."""
    tuned = triton.autotune(configs=WARPS, key=["n_cols"])(kernel)

    def launch(grid, n_cols, *args, **meta):
        if n_cols > TUNED_COLS and not INTERPRET:
            tuned[grid](*args, **meta)
        else:
            kernel[grid](*args, num_warps=4, **meta)
    return launch


@triton.jit
def _forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # one program per row: the row is loaded once and stays in registers
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols  # BLOCK is the next power of two: the lanes past n_cols neither load nor store
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)  # 4 bytes a row, so the backward need not reduce the row again
    tl.store(y_ptr + row * stride_y + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, n_rows, n_cols, rows_per_program,
                     stride_dy, stride_x, stride_dx, BLOCK: tl.constexpr):
    # With x_hat = x * rstd and g = dy * w, per row:  dx = rstd * (g - x_hat * mean(g * x_hat)),
    # and dw = sum over rows of dy * x_hat. Each program takes a run of rows and keeps its share of dw in
    # fp32 registers; a second kernel adds the programs' shares (no atomics: the result is deterministic).
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    first = pid * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, n_rows)):
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        x_hat = x * rstd
        g = dy * w
        dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols))
        tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * x_hat
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=mask)


_forward = _launcher(_forward_kernel)
_backward = _launcher(_backward_kernel)


@triton.jit
def _column_sum_kernel(partial_ptr, out_ptr, n_rows, n_cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    total = tl.zeros((BLOCK_COLS,), dtype=tl.float32)
    for start in range(0, n_rows, BLOCK_ROWS):
        rows = start + tl.arange(0, BLOCK_ROWS)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        total += tl.sum(tl.load(partial_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0), axis=0)
    tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., n) -> (rows, n) with unit stride along n: a view when the layout allows, a copy otherwise."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def _programs(rows: int, device: torch.device) -> int:
    """Enough programs to fill the GPU a few times over; each adds up its rows' dw in registers."""
    if device.type != "cuda":
        return min(rows, 4)
    return min(rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count)


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        n = x.shape[-1]
        assert weight.shape == (n,), f"weight must have shape ({n},), got {tuple(weight.shape)}"
        assert n <= MAX_COLS and x.numel() < 2**31, "rows longer than MAX_COLS or tensors of 2^31 elements"
        x2, weight = _rows(x), weight.contiguous()  # the kernels walk both with unit stride along n
        y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        if x2.numel():
            _forward((x2.shape[0],), n, x2, weight, y, rstd, n, x2.stride(0), y.stride(0), eps,
                     BLOCK=triton.next_power_of_2(n))
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dy2 = _rows(dy)
        rows, n = x2.shape
        dx = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
        dw = torch.empty(n, dtype=weight.dtype, device=weight.device)
        programs = max(_programs(rows, x2.device), 1)
        partial = torch.empty((programs, n), dtype=torch.float32, device=x2.device)
        if rows:
            _backward((programs,), n, dy2, x2, weight, rstd, dx, partial, rows, n, triton.cdiv(rows, programs),
                      dy2.stride(0), x2.stride(0), dx.stride(0), BLOCK=triton.next_power_of_2(n))
        else:
            partial.zero_()
        _column_sum_kernel[(triton.cdiv(n, 64),)](partial, dw, programs, n, BLOCK_ROWS=32, BLOCK_COLS=64)
        return dx.view(ctx.shape), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension of x (fp32, fp16 or bf16); the result has x's dtype. Differentiable."""
    return RMSNormFunction.apply(x, weight, eps)
