"""Week 7 performance on a GPU: bandwidth as a fraction of this device's calibrated copy bandwidth."""
import pytest

from infracourse.grader import assert_close, require_fraction, tensors, timed


N = 2**26 + 3


@pytest.fixture(scope="module")
def ops(learner):
    return learner.module("vector_ops")


@pytest.mark.check("add-bandwidth")
def test_add_bandwidth(ops, ceilings, record, lab_check, seed):
    def check(out, args):
        assert_close(out, args[0].double() + args[1].double(), what="a timed add output")

    timing = timed(ops.add, tensors([[N], [N]], seed=seed), check=check, bytes_moved=3 * N * 4, ceilings=ceilings,
                   label="add", require_kernel=True)
    gbps = 3 * N * 4 / timing.seconds / 1e9
    require_fraction(gbps, ceilings.copy_gbps, lab_check.threshold, unit="GB/s", what="add fp32 at 2^26+3",
                     record=record, name="add bandwidth")


@pytest.mark.check("reduce-bandwidth")
def test_reduce_bandwidth(ops, ceilings, record, lab_check, seed):
    def check(out, args):
        ref = args[0].double().sum().item()
        assert abs(out.item() - ref) <= 1e-5 * ref, f"a timed reduce_sum output is {out.item()}, expected {ref}"

    timing = timed(ops.reduce_sum, tensors([[N]], kind="rand", seed=seed), check=check, bytes_moved=N * 4,
                   ceilings=ceilings, label="reduce_sum", require_kernel=True)
    gbps = N * 4 / timing.seconds / 1e9
    require_fraction(gbps, ceilings.copy_gbps, lab_check.threshold, unit="GB/s", what="reduce_sum fp32 at 2^26+3",
                     record=record, name="reduce bandwidth")
