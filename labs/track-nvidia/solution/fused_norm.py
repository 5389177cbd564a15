"""RMSNorm as one fused operator: y = x / sqrt(mean(x^2) + eps) * weight, forward and backward.

On a GPU each direction is one Triton kernel (one program per row): x is read once, rstd (one fp32 per row)
is kept for the backward, and no fp32 copy of the activation is made. On a CPU the same two passes run as
torch ops in a torch.autograd.Function (the Triton interpreter is far too slow for a training step there):
the backward uses the saved rstd instead of autograd's chain through five ops.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)
    tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dwp_ptr, n_cols, BLOCK: tl.constexpr):
    # dx = rstd * (g - x_hat * mean(g * x_hat)) with g = dy * w; this row's dy * x_hat goes to dw's partials
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    x_hat = x * rstd
    g = dy * w
    dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols))
    tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dwp_ptr + row * n_cols + cols, dy * x_hat, mask=mask)


class FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (rows, n); a view when x already is contiguous
        if x.is_cuda:
            y = torch.empty_like(x2)
            rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
            _forward_kernel[(x2.shape[0],)](x2, weight, y, rstd, x2.shape[1], eps,
                                            BLOCK=triton.next_power_of_2(x2.shape[1]))
        else:
            x32 = x2.float()
            rstd = torch.rsqrt(x32.pow(2).mean(-1) + eps)
            y = (x32 * rstd[:, None] * weight.float()).to(x.dtype)
        ctx.save_for_backward(x2, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dy2 = dy.reshape(x2.shape).contiguous()
        if dy.is_cuda:
            dx = torch.empty_like(x2)
            partial = torch.empty(x2.shape, dtype=torch.float32, device=dy.device)
            _backward_kernel[(x2.shape[0],)](x2, weight, dy2, rstd, dx, partial, x2.shape[1],
                                             BLOCK=triton.next_power_of_2(x2.shape[1]))
            dw = partial.sum(0)
        else:
            x_hat = x2.float() * rstd[:, None]
            g = dy2.float() * weight.float()
            dx = rstd[:, None] * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
            dw = (dy2.float() * x_hat).sum(0)
        return dx.to(x2.dtype).view(dy.shape), dw.to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension of x; y has x's shape and dtype. Differentiable in x and weight."""
    return FusedRMSNorm.apply(x, weight, eps)
