"""Week 10 correctness: forward and gradients against autograd of the unfused ops, edge inputs, masks, own
kernels, and the norm plugged into the course's GPT."""
import dataclasses

import pytest
import torch

from infracourse.grader import (LabCheckFailed, assert_close, assert_grad_close, dtype_name, explain_nan, fenced,
                                in_worker, interpreter_note, relative_error, require_own_kernel, require_plain_tensor,
                                run_watched)
from infracourse.kit import probes
from infracourse.kit.gpt import GPTConfig, synthetic_batch
from infracourse.kit.probes import GPTTrainer

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (rows, hidden) and (batch, seq, hidden): hidden sizes that are no power of two, one row, 3-D activations
SHAPES = [(1, 1), (3, 33), (17, 127), (8, 1000), (2, 5, 64), (4, 3, 257)]
# Gradients: each element within compare.GRADIENT_TOLERANCES x (|reference| + rms of its row), on CPU and on
# the GPU's timed shapes alike. dw sums every row: far more rows than any tile or program count, so a reduction
# that drops rows past the first programs' share, or adds in fp16/bf16, shows.
MANY_ROWS = [(4099, 8, torch.float32)]  # (one case: 4099 interpreted programs cost ~30 s on a CPU)
GRADIENT_HINT = ("With x_hat = x * rstd and g = dy * w: dx = rstd * (g - x_hat * mean(g * x_hat)) over each row, "
                 "dw = sum over all rows of dy * x_hat, both in fp32.")
SCALE = 2.5  # inputs of rms 2.5, so 1/rms is not 1 and a dropped factor of rstd shows


def make_inputs(shape, dtype, device, weight_dtype=None):
    x = (torch.randn(shape, device=device) * SCALE).to(dtype)
    weight = (1 + 0.5 * torch.randn(shape[-1], device=device)).to(weight_dtype or dtype)
    return x, weight


def check_forward(rms, x, weight, reference, what, eps=None, fenced_inputs=False):
    args = (x, weight) if eps is None else (x, weight, eps)
    out = run_watched(rms.rms_norm, *args, name="rms_norm", require_kernel=False)
    require_plain_tensor(out, like=x, what=f"rms_norm output for {what} (x's shape and dtype)")
    if fenced_inputs and torch.isnan(out).any():  # NaN beyond the inputs, outputs poisoned: which one?
        explain_nan(rms.rms_norm, args, name="rms_norm", what=f"rms_norm for {what}",
                    never_written="Launch one program per row (or cover every row with your loop) and store every "
                                  "column below n_cols.",
                    past_end="Mask every tl.load of x and weight with cols < n_cols (other=0.0).")
    expected = reference(x, weight) if eps is None else reference(x, weight, eps=eps)
    try:
        assert_close(out, expected, what=f"rms_norm for {what}")
    except LabCheckFailed as exc:
        raise LabCheckFailed(f"{exc}.{interpreter_note(x.dtype)}") from None


def require_grad_close(actual, expected, like, what):
    """Each element within compare.GRADIENT_TOLERANCES x (|reference| + rms of the reference's row)."""
    require_plain_tensor(actual, like=like, what=what)
    assert_grad_close(actual, expected, what=f"{what} (reference: autograd of the unfused ops)", hint=GRADIENT_HINT)


def gradients(rms, x, weight, dy, eps=None):
    """(y, dx, dw) from the learner's rms_norm through torch.autograd."""
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    y = rms.rms_norm(x, weight) if eps is None else rms.rms_norm(x, weight, eps)
    dx, dw = torch.autograd.grad(y, (x, weight), dy)
    return y, dx, dw


def check_backward(rms, x, weight, dy, reference, what, eps=None):
    y, dx, dw = gradients(rms, x, weight, dy, eps)
    _, dx_ref, dw_ref = reference(x, weight, dy) if eps is None else reference(x, weight, dy, eps=eps)
    require_grad_close(dx, dx_ref, x, f"dx for {what}")
    require_grad_close(dw, dw_ref, weight, f"dw for {what}")


@pytest.mark.check("forward-correct")
def test_forward_correct(rms, device, seed, reference):
    for dtype in DTYPES:
        for shape in SHAPES:
            x, weight = make_inputs(shape, dtype, device)
            check_forward(rms, x, weight, reference, f"x {shape} {dtype_name(dtype)} (seed {seed})")
            if dtype != torch.float32:  # mixed precision: fp32 weights, half activations; y keeps x's dtype
                x, weight = make_inputs(shape, dtype, device, weight_dtype=torch.float32)
                check_forward(rms, x, weight, reference, f"x {shape} {dtype_name(dtype)} with an fp32 weight (seed {seed})")


@pytest.mark.check("backward-correct")
def test_backward_correct(rms, device, seed, reference):
    for dtype in DTYPES:
        for shape in SHAPES[1:]:  # hidden size 1 makes dx a cancellation of two equal terms: no fair test
            x, weight = make_inputs(shape, dtype, device)
            dy = torch.randn(shape, device=device).to(dtype)
            check_backward(rms, x, weight, dy, reference, f"x {shape} {dtype_name(dtype)} (seed {seed})")
        # layouts autograd hands over in a real model: a sliced x and a transposed (non-contiguous) dy
        base = (torch.randn(9, 140, device=device) * SCALE).to(dtype)
        weight = (1 + 0.5 * torch.randn(129, device=device)).to(dtype)
        dy = torch.randn(129, 9, device=device).to(dtype).t()
        check_backward(rms, base[:, 5:134], weight, dy, reference,
                       f"a sliced x (row stride 140, hidden 129) and a transposed dy, {dtype_name(dtype)} (seed {seed})")
    for rows, cols, dtype in MANY_ROWS:
        x, weight = make_inputs((rows, cols), dtype, device)
        dy = torch.randn(rows, cols, device=device).to(dtype)
        check_backward(rms, x, weight, dy, reference, f"x ({rows}, {cols}) {dtype_name(dtype)}: dw sums all {rows} rows "
                       f"(seed {seed})")
    for dtype in (torch.float16, torch.bfloat16):
        x, weight, dy = tall_half_inputs(dtype, device)
        check_backward(rms, x, weight, dy, reference,
                       f"x {tuple(x.shape)} {dtype_name(dtype)} where every {SUM_PERIOD}th row of dy is 1 and the rest "
                       f"are below half a {dtype_name(dtype)} step of 1 (dw's sums over rows must be kept in fp32)")


SUM_PERIOD, TALL_ROWS = 128, 512


def tall_half_inputs(dtype, device):
    """Inputs on which dw = sum over rows of dy * x_hat is lost when the running sum is kept in fp16/bf16, by
    construction (no seed decides it): x is ±SCALE, so x_hat is ±1; each row's dy * x_hat is 1 on every
    SUM_PERIOD-th row and 0.9 x half the dtype's step at 1 elsewhere. Added to a running sum of 1 or more in the
    input dtype, each small term rounds away (5 % of dw in fp16, 31 % in bf16, against a 0.8 % and 4 %
    tolerance); in fp32 every one counts. TALL_ROWS: four periods, so a sum over all rows (one program, or
    atomics in row order) and each of the 4 runs of rows the reference's programs take on a CPU start at a row
    of 1, and every small term is lost (fewer rows: fewer runs hold a row of 1, and less of dw is lost)."""
    cols = 8
    sign = torch.where(torch.rand(TALL_ROWS, cols, device=device) < 0.5, -1.0, 1.0)
    x = (sign * SCALE).to(dtype)
    small = 0.9 * torch.finfo(dtype).eps / 2
    size = torch.full((TALL_ROWS, 1), small, device=device)
    size[::SUM_PERIOD] = 1.0
    weight = (1 + 0.5 * torch.randn(cols, device=device)).to(dtype)
    return x, weight, (sign * size).to(dtype)


@pytest.mark.check("edge-inputs")
def test_edge_inputs(rms, device, reference):
    # fp16 values of 600: their squares (3.6e5) overflow fp16, not fp32
    x, weight = make_inputs((4, 257), torch.float16, device)
    x = (x.float() / SCALE * 600).to(torch.float16)
    dy = torch.randn(4, 257, device=device).to(torch.float16)
    check_forward(rms, x, weight, reference, "fp16 values near 600 (x^2 overflows fp16: square in fp32)")
    check_backward(rms, x, weight, dy, reference, "fp16 values near 600")
    # a row of zeros (rstd = 1/sqrt(eps)) and rows far smaller than sqrt(eps), where eps decides the scale
    x, weight = make_inputs((5, 100), torch.float32, device)
    x[1] = 0
    x[3] *= 1e-5
    dy = torch.randn(5, 100, device=device)
    check_forward(rms, x, weight, reference, "fp32 rows of zeros and of 1e-5 (eps inside the square root)")
    check_backward(rms, x, weight, dy, reference, "fp32 rows of zeros and of 1e-5")
    # the eps argument, passed positionally
    x, weight = make_inputs((6, 48), torch.float32, device)
    x *= 0.05
    check_forward(rms, x, weight, reference, "eps=1e-2 on small fp32 values (use the eps you are given)", eps=1e-2)
    check_backward(rms, x, weight, torch.randn(6, 48, device=device), reference, "eps=1e-2", eps=1e-2)


def _backward_node(learner, rms, x, weight, what):
    """The learner's autograd.Function node behind rms_norm(x, weight), in the worker (kit.probes): its
    backward(dy) runs their backward alone, so a watched call of it observes just that."""
    node = learner.build(probes.AutogradNode, rms.rms_norm, (x, weight))
    if node.custom is not True:
        made_by = node.grad_fn_type or "nothing (no grad_fn)"
        raise LabCheckFailed(
            f"{what}: its grad_fn is {made_by}, so autograd differentiates torch ops, not your backward kernel. "
            "Write a torch.autograd.Function whose forward and backward launch your kernels, and return "
            "YourFunction.apply(x, weight, eps) as it is (do any reshaping inside forward and backward).")
    return node


def check_watched_backward(rms, learner, x, weight, dy, reference, what, require_kernel=False):
    """Run the learner's backward itself under watch (poisoned outputs, recorded ops) and check its grads."""
    node = _backward_node(learner, rms, x, weight, f"rms_norm's output for {what}")
    grads = run_watched(node.backward, dy, name=f"rms_norm's backward for {what}", require_kernel=require_kernel,
                        replaces="torch ops for the gradient arithmetic (mul, sum, mean, ...)")
    if not isinstance(grads, tuple) or len(grads) < 2:
        raise LabCheckFailed(f"your backward returned {type(grads).__name__}; return (dx, dw, None): one gradient "
                             "per input of forward (x, weight, eps)")
    _, dx_ref, dw_ref = reference(x, weight, dy)
    require_grad_close(grads[0], dx_ref, x, f"dx for {what}")
    require_grad_close(grads[1], dw_ref, weight, f"dw for {what}")


@pytest.mark.check("masks")
def test_masks(rms, learner, device, reference):
    # x, weight and dy sit between NaN fences and outputs between canaries: a load past the end of a row
    # reads the next row (or NaN after the last), a store past it changes a neighbour or a canary.
    for rows, cols in [(3, 33), (7, 127), (5, 1000), (2, 1)]:
        x, weight = (fenced(t) for t in make_inputs((rows, cols), torch.float32, device))
        dy = fenced(torch.randn(rows, cols, device=device))
        what = f"x ({rows}, {cols}) fp32 with fenced inputs"
        check_forward(rms, x, weight, reference, what, fenced_inputs=True)
        if cols > 1:
            check_watched_backward(rms, learner, x, weight, dy, reference, what)


def _watched_cases(device):
    """(what, x, weight, dy) for kernel-did-work: three cases that differ from one another in every property a
    route could be chosen by (rows, hidden size, power of two or not, dtype, 2-D or 3-D, contiguous x and dy),
    so code that launches its kernels only at what one case looks like and uses torch ops elsewhere fails."""
    x, weight = make_inputs((16, 96), torch.float32, device)
    yield "x (16, 96) fp32", x, weight, torch.randn(16, 96, device=device)
    x, weight = make_inputs((3, 5, 257), torch.float16, device)
    yield "x (3, 5, 257) fp16", x, weight, torch.randn(3, 5, 257, device=device).to(torch.float16)
    base = (torch.randn(37, 140, device=device) * SCALE).to(torch.bfloat16)
    weight = (1 + 0.5 * torch.randn(129, device=device)).to(torch.bfloat16)
    dy = torch.randn(129, 37, device=device).to(torch.bfloat16).t()
    yield "a sliced x (37, 129) bf16 (row stride 140) and a transposed dy", base[:, 5:134], weight, dy


@pytest.mark.check("kernel-did-work")
def test_kernel_did_work(rms, learner, device, reference):
    for what, x, weight, dy in _watched_cases(device):
        run_watched(rms.rms_norm, x.detach().requires_grad_(), weight.detach().requires_grad_(),
                    name=f"rms_norm for {what}",
                    replaces="torch ops for the arithmetic (pow, mean, rsqrt, mul) or F.rms_norm")
        # The backward is watched with an fp32 weight (mixed precision, as forward-correct grades it): dw then
        # needs no cast, and a dw accumulated in fp32 and returned as .to(weight.dtype) (a copy the worker's
        # record does not trace to the kernel that wrote it) is no failure of data flow.
        check_watched_backward(rms, learner, x, weight.float(), dy, reference, f"{what} with an fp32 weight",
                               require_kernel=True)
    require_own_kernel(rms.rms_norm, backward=True)  # the judge's reading: forward and backward launch kernels


@pytest.mark.check("model-integration")
def test_model_integration(rms, learner, device, seed):
    # The course's GPT with the default (unfused) RMSNorm, here, and with yours, in the worker: same seed, same
    # batch, one forward and backward.
    cfg = GPTConfig(seq_len=16)
    idx, targets = synthetic_batch(cfg, 2, seed=seed, device=device)
    options = {"seed": seed % 1000, "device": device}
    expected_loss, expected = GPTTrainer(cfg, None, **options).gradients(idx, targets)
    yours = learner.build(probes.GPTTrainer, in_worker(GPTConfig, **dataclasses.asdict(cfg)), rms.rms_norm, **options)
    answer = yours.gradients(idx, targets)
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], float)
            and isinstance(answer[1], dict)):
        raise LabCheckFailed("the GPT with your rms_norm did not report a loss and gradients")
    loss, grads = answer
    if not abs(loss - expected_loss) <= 1e-5 * abs(expected_loss):
        raise LabCheckFailed(f"GPT loss with your rms_norm is {loss:.7g}, with the unfused norm "
                             f"{expected_loss:.7g} (seed {seed}): plug-in must not change the model")
    for name, want in expected.items():
        got = grads.get(name)
        if got is None:
            raise LabCheckFailed(f"GPT with your rms_norm: {name} received no gradient; return dx and dw from "
                                 "your backward (and None for eps)")
        require_plain_tensor(got, like=want, what=f"the gradient of {name} in the GPT with your rms_norm")
        err = relative_error(got, want)
        if not err <= 1e-4:
            raise LabCheckFailed(f"GPT with your rms_norm: the gradient of {name} differs from the unfused model's "
                                 f"(relative error {err:.2e} > 1e-4, seed {seed})")
