"""Week 9 graders: the learner's module and the error each dtype may show."""
import pytest
import torch

from infracourse.kit.triton_compat import patch_interpreter_scalars

patch_interpreter_scalars()  # runtime-bounded K loops under TRITON_INTERPRET=1 with NumPy >= 2.4

# Norm-wise relative error ||C - C_ref|| / ||C_ref|| against a float64 product of the same inputs.
# fp32 "ieee" (torch's default, allow_tf32 False) measures about 1e-7; tf32 tensor cores, allowed only when
# torch.backends.cuda.matmul.allow_tf32 is set, 3e-4 to 1e-3. fp16/bf16 outputs carry their own rounding
# (about 2e-4 and 2e-3); an fp16 accumulator over K = 4096 adds about 3e-3, inputs rounded to bf16 3e-3.
BOUNDS = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
TF32_BOUND = 2e-3


@pytest.fixture(scope="session")
def mm(learner):
    return learner.module("matmul")


@pytest.fixture(autouse=True)
def fp32_is_ieee():
    """Every check starts from torch's default, tf32 off (the learner's module cannot relax it at import);
    fp32-precision turns it on itself."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
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
