"""Week 8 graders' shared fixtures: the learner's softmax on either route, and how its output is judged.

Two routes, chosen by BACKEND in softmax.py: "triton" (runs everywhere; on a CPU through the interpreter)
or "cuda" (the kernel in softmax_cuda.cu, built with torch.utils.cpp_extension; it runs only on a GPU, so
on a CPU its checks are blocked and kernel-did-work compile-checks the file with nvcc instead).
"""
import pytest
import torch

from infracourse.grader import (LabCheckFailed, LearnerRaised, assert_close, blocked, interpreter_note,
                                require_plain_tensor, run_watched, tolerance)


ROUTES = ("triton", "cuda")
# Below 6.1e-5 fp16 is subnormal, spaced 6e-8 apart: rounding there loses up to half a step whatever the kernel.
FP16_SUBNORMAL_STEP = 6e-8


@pytest.fixture(scope="session")
def module(learner):
    return learner.module("softmax")


@pytest.fixture(scope="session")
def route(module) -> str:
    try:
        backend = module.BACKEND
    except LearnerRaised as exc:  # the attribute is looked up in the worker: a missing one arrives as this
        if exc.type_name != "AttributeError":
            raise
        backend = "triton"  # a softmax.py without BACKEND takes the Triton route
    if backend not in ROUTES:
        raise LabCheckFailed(f"softmax.py sets BACKEND = {backend!r}: use \"triton\" or \"cuda\"")
    return backend


@pytest.fixture(scope="session")
def softmax(module, route, device):
    """The learner's softmax (in the grading worker). The CUDA route's extension is built now, in the worker
    and outside any check's watch (about a minute: the worker's build folder lasts one grading session)."""
    if route == "cuda":
        if device != "cuda":
            blocked("the CUDA C++ route (BACKEND = \"cuda\") runs only on a CUDA GPU; on this "
                    "machine kernel-did-work compile-checks softmax_cuda.cu with nvcc")
        module.softmax(torch.zeros(2, 8, device="cuda"))
    return module.softmax


def softmax_tolerance(x: torch.Tensor) -> tuple[float, float]:
    """(rtol, atol) for a softmax of x. Outputs are about 1/n for rows of n, so the absolute tolerance shrinks
    with n: a fixed 1e-6 would accept zeros for every element of a long row."""
    rtol, _ = tolerance(x.dtype)
    n = max(x.shape[-1], 1)
    return rtol, FP16_SUBNORMAL_STEP if x.dtype == torch.float16 else 1e-6 / n


def expect_softmax(out, x: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """out must be a plain tensor like x holding softmax(x) (`expected`, float64) within tolerance."""
    require_plain_tensor(out, like=x, what=f"softmax output for {what}")
    rtol, atol = softmax_tolerance(x)
    try:
        assert_close(out, expected, rtol=rtol, atol=atol, what=f"softmax for {what}")
    except LabCheckFailed as exc:
        raise LabCheckFailed(f"{exc}.{interpreter_note(x.dtype)}") from None


@pytest.fixture(scope="session")
def expect():
    return expect_softmax


@pytest.fixture(scope="session")
def graded(softmax):
    """graded(x, what): call the learner's softmax watched (poisoned outputs, fenced stores, inputs that must
    stay unchanged) and compare with the float64 softmax of a private copy of x."""
    def _graded(x: torch.Tensor, what: str):
        expected = torch.softmax(x.detach().double(), dim=-1)
        out = run_watched(softmax, x, name="softmax", require_kernel=False)
        expect_softmax(out, x, expected, what)
        return out

    return _graded


@pytest.fixture(scope="session")
def timed_check():
    """check(out, args) for bench.measure: each sampled timed output must be softmax(args[0])."""
    def check(out, args):
        x = args[0]
        expect_softmax(out, x, torch.softmax(x.double(), dim=-1), f"a timed call on {tuple(x.shape)} {x.dtype}")

    return check
