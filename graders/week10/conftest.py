"""Week 10 graders: the learner's module, and the unfused RMSNorm every result is compared with."""
import pytest
import torch


@pytest.fixture(scope="session")
def rms(learner):
    return learner.module("rmsnorm")


def _unfused(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.fixture(scope="session")
def unfused():
    """unfused(x, weight, eps=1e-6): RMSNorm as separate torch ops (square, mean, add, rsqrt, two multiplies)."""
    return _unfused


@pytest.fixture(scope="session")
def reference():
    """reference(x, weight, dy=None, eps=1e-6): y (and dx, dw) by autograd of the unfused ops in float64."""
    def _reference(x, weight, dy=None, eps=1e-6):
        x64 = x.detach().double().requires_grad_()
        w64 = weight.detach().double().requires_grad_()
        y = _unfused(x64, w64, eps)
        if dy is None:
            return y.detach()
        dx, dw = torch.autograd.grad(y, (x64, w64), dy.double())
        return y.detach(), dx, dw

    return _reference
