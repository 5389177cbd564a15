"""Week 9 graders: the learner's module, the tf32 switch it reads, and the error each dtype may show."""
import pytest
import torch

from infracourse.grader import LabCheckFailed
from infracourse.kit import probes


# Norm-wise relative error ||C - C_ref|| / ||C_ref|| against a float64 product of the same inputs.
# fp32 "ieee" (torch's default, allow_tf32 False) measures about 1e-7; tf32 tensor cores, allowed only when
# torch.backends.cuda.matmul.allow_tf32 is set, 3e-4 to 1e-3. fp16/bf16 outputs carry their own rounding
# (about 2e-4 and 2e-3); an fp16 accumulator over K = 4096 adds about 3e-3, inputs rounded to bf16 3e-3.
BOUNDS = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
TF32_BOUND = 2e-3


@pytest.fixture(scope="session")
def mm(learner):
    return learner.module("matmul")


@pytest.fixture(scope="session")
def tf32(learner):
    """tf32(allow): set torch.backends.cuda.matmul.allow_tf32 in the worker, where the learner's matmul reads
    it, and here, where the error bound and the advice read it."""
    def _set(allow: bool) -> None:
        got = learner.build(probes.set_tf32, allow)
        if got is not allow:
            raise LabCheckFailed(f"torch.backends.cuda.matmul.allow_tf32 could not be set to {allow} in the process "
                                 f"running your code (it reads {got!r}): do not replace torch's backend flags")
        torch.backends.cuda.matmul.allow_tf32 = allow

    return _set


@pytest.fixture(autouse=True)
def fp32_is_ieee(request):
    """Every check of the learner's matmul starts from torch's default, tf32 off, set after the module was
    imported (so it cannot relax it at import); fp32-precision turns it on itself."""
    saved = torch.backends.cuda.matmul.allow_tf32
    if "mm" in request.fixturenames:
        request.getfixturevalue("mm")
        request.getfixturevalue("tf32")(False)
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(scope="session")
def error_bound():
    """error_bound(dtype): the largest relative error a correct matmul of this dtype shows under the current
    torch.backends.cuda.matmul.allow_tf32."""
    def bound(dtype):
        if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
            return TF32_BOUND
        return BOUNDS[dtype]

    return bound
