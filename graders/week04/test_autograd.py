"""Week 4 autograd: RMSNormFunction's hand-written backward against numerical and autograd gradients."""
import pytest
import torch

from infracourse.grader import LabCheckFailed, assert_close
from infracourse.kit import probes_autograd
from infracourse.kit.gpt import RMSNorm

EPS = 1e-6
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5  # fp32 gradients: the hand-written formula sums in another order


@pytest.fixture(scope="module")
def fn(learner):
    return learner.module("rmsnorm_function")


def _unfused(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _require_own_function(learner, fn, x, w):
    """The output's autograd node, as the worker sees it (the judge's copy is the bridge's node)."""
    origin = learner.build(probes_autograd.grad_fn_origin, fn.rms_norm, fn.RMSNormFunction, x, w, EPS)
    if not (isinstance(origin, dict) and origin.get("own") is True):
        name = str(origin.get("grad_fn", "?"))[:100] if isinstance(origin, dict) else "?"
        raise LabCheckFailed(f"rms_norm's output has grad_fn {name}, not RMSNormFunction's "
                             "backward: return RMSNormFunction.apply(x, weight, eps) so your backward is the one used")


def _require_hand_written_backward(learner, fn, x, w):
    """The backward, watched by the profiler and by saved-tensor hooks, evaluates no autograd node but the
    Function's own and builds no graph; its gradients (observed) equal autograd's of the unfused ops."""
    got = learner.build(probes_autograd.backward_evidence, fn.rms_norm, fn.RMSNormFunction, x, w, EPS)
    if not (isinstance(got, dict) and isinstance(got.get("others"), list) and type(got.get("saved")) is int):
        raise LabCheckFailed(f"the watched backward of rms_norm came back malformed ({str(got)[:200]})")
    if got["others"] or got["saved"] or got.get("error"):
        seen = f"evaluated autograd nodes {got['others'][:6]}" if got["others"] else \
            f"saved {got['saved']} tensors for a backward of its own" if got["saved"] else got["error"]
        raise LabCheckFailed(
            f"RMSNormFunction.backward lets autograd compute the gradients ({seen}): write dx and dweight "
            "yourself from the saved tensors, with tensor ops only (no torch.autograd.grad, torch.func or "
            "torch.enable_grad in backward)")
    grads = got.get("grads")
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    true = torch.autograd.grad(_unfused(x2, w2).sum(), (x2, w2))
    for name, mine, want in zip(("dx", "dweight"), grads or (None, None), true):
        # compared with what the unwatched gradcheck saw: a backward that changes when watched fails here
        assert_close(mine, want, rtol=GRAD_RTOL, atol=GRAD_ATOL * max(1.0, want.abs().max().item()),
                     what=f"{name} of rms_norm while the backward was watched (profiler, saved-tensor hooks)")


def _diagnose(fn, x, w) -> str:
    """Which gradient is wrong, and by roughly what factor, against autograd of the unfused ops."""
    grad_out = torch.randn(x.shape, dtype=x.dtype)
    mine = torch.autograd.grad(fn.rms_norm(x, w, EPS), (x, w), grad_out)
    true = torch.autograd.grad(_unfused(x, w), (x, w), grad_out)
    parts = []
    for name, a, b in zip(("grad of x", "grad of weight"), mine, true):
        if not torch.allclose(a, b, rtol=1e-6, atol=1e-8):
            factor = (a * b).sum() / (b * b).sum()
            parts.append(f"{name} is off (about {factor.item():.3g} x the true gradient along it)")
    return "; ".join(parts) or "the gradients disagree with finite differences"


@pytest.mark.check("autograd-gradcheck")
def test_gradcheck(learner, fn):
    cases = {"(3, 7)": torch.randn(3, 7), "(2, 5, 16)": torch.randn(2, 5, 16), "(1, 1)": torch.randn(1, 1),
             "(4, 1, 9)": torch.randn(4, 1, 9), "a transposed (4, 9)": torch.randn(9, 4).t()}
    for what, base in cases.items():
        x = base.double().requires_grad_()
        w = torch.randn(x.shape[-1], dtype=torch.float64, requires_grad=True)
        _require_own_function(learner, fn, x, w)
        # forward and every vector-Jacobian product run in the worker (grading.remote bridges autograd)
        if not torch.autograd.gradcheck(fn.rms_norm, (x, w, EPS), raise_exception=False):
            raise LabCheckFailed(f"gradcheck in float64 fails for x of shape {what}: {_diagnose(fn, x, w)}. "
                                 "Derive dx through r = 1/sqrt(mean(x^2) + eps), which depends on every x of the row.")
    _require_hand_written_backward(learner, fn, torch.randn(4, 9, dtype=torch.float64),
                                   torch.randn(9, dtype=torch.float64))


@pytest.mark.check("autograd-matches-unfused")
def test_matches_unfused(learner, fn):
    for shape in [(8, 64), (2, 33, 96), (1, 5, 1)]:
        for scale in (1.0, 1e-3, 1e3):  # 1e-3: mean(x^2) is near eps, so where eps goes shows
            x = torch.randn(shape) * scale
            grad_out = torch.randn(shape)
            reference = RMSNorm(shape[-1], eps=EPS)
            with torch.no_grad():
                reference.weight.copy_(torch.randn(shape[-1]))
            x_ref = x.clone().requires_grad_()
            y_ref = reference(x_ref)
            y_ref.backward(grad_out)
            x_mine, w_mine = x.clone().requires_grad_(), reference.weight.detach().clone().requires_grad_()
            _require_own_function(learner, fn, x_mine, w_mine)
            y = fn.rms_norm(x_mine, w_mine, EPS)
            what = f"rms_norm of a {shape} input scaled by {scale:g}"
            assert_close(y, y_ref, what=f"{what}: output")
            y.backward(grad_out)
            for name, got, want in (("dx", x_mine.grad, x_ref.grad), ("dweight", w_mine.grad, reference.weight.grad)):
                # dx = r * (g - x_hat * mean(g * x_hat)) cancels: the absolute tolerance follows its magnitude
                atol = GRAD_ATOL * max(1.0, want.abs().max().item())
                assert_close(got, want, rtol=GRAD_RTOL, atol=atol, what=f"{what}: {name}")
