"""Week 8 on a GPU: large shapes, bandwidth against this device's calibrated copy bandwidth, and speed
against torch.softmax on the same device, all timed by the one harness (fresh inputs, sampled outputs
checked, L2 flushed, events + device-wide synchronise + wall-clock cross-check, physics floor)."""
import pytest
import torch

from infracourse.grader import reference_time, require_fraction, require_speedup, tensors, timed


WIDE = (8192, 4096)  # the shape the course compares at (h200.json: torch.softmax reaches ~58 % of copy here)
LONG = (1024, 131072)  # rows of 512 KiB: longer than any one-block kernel can hold
FLOPS_PER_ELEMENT = 5  # max, subtract, exp, add, scale


def _traffic(shape, dtype=torch.float32) -> tuple[int, int]:
    """(bytes read + written, flops) of a softmax that reads x once and writes y once."""
    n = shape[0] * shape[1]
    return 2 * n * dtype.itemsize, FLOPS_PER_ELEMENT * n


def _inputs(shape, seed):
    """The spec of the fresh fp32 inputs of timed calls (built in the worker and, to check them, here)."""
    return tensors([list(shape)], seed=seed)


def _label(shape) -> str:
    return f"softmax {shape[0]}x{shape[1]} fp32"


@pytest.mark.check("large")
def test_large(graded, seed):
    cases = {
        "8192x4096 fp16": torch.randn(WIDE, device="cuda").to(torch.float16),
        "8192x4096 bf16": torch.randn(WIDE, device="cuda").to(torch.bfloat16),
        "64 rows of 2^20 + 3 fp32": torch.randn(64, 2**20 + 3, device="cuda"),
        "one row of 2^24 + 1 fp32": torch.randn(1, 2**24 + 1, device="cuda"),
    }
    for what, x in cases.items():
        graded(x, f"{what} (seed {seed})")


@pytest.mark.check("bandwidth")
def test_bandwidth(softmax, route, timed_check, ceilings, record, lab_check, seed):
    nbytes, flops = _traffic(WIDE)
    timing = timed(softmax, _inputs(WIDE, seed), check=timed_check, bytes_moved=nbytes, ceilings=ceilings,
                   label="softmax", require_kernel=route == "triton")
    require_fraction(nbytes / timing.seconds / 1e9, ceilings.copy_gbps, lab_check.threshold, unit="GB/s",
                     what="softmax 8192x4096 fp32", record=record, name=f"{_label(WIDE)} bandwidth",
                     bytes=nbytes, flops=flops, seconds=timing.seconds, label=_label(WIDE), timing=timing.as_dict())


def _against_torch(softmax, route, timed_check, ceilings, record, lab_check, shape, seed):
    nbytes, flops = _traffic(shape)
    spec = _inputs(shape, seed)
    # the Triton route's timed calls must launch its kernels too (as the worker recorded them)
    timing = timed(softmax, spec, check=timed_check, bytes_moved=nbytes, ceilings=ceilings, label="softmax",
                   require_kernel=route == "triton")
    torch_timing = reference_time(lambda x: torch.softmax(x, dim=-1), spec)
    require_speedup(timing.seconds, torch_timing.seconds, lab_check.threshold, reference="torch.softmax",
                    what=f"softmax {shape[0]}x{shape[1]} fp32", record=record,
                    name=f"{_label(shape)} speed-up over torch.softmax", label=_label(shape), bytes=nbytes,
                    flops=flops, gbps=nbytes / timing.seconds / 1e9, torch_gbps=nbytes / torch_timing.seconds / 1e9,
                    timing=timing.as_dict(), reference_timing=torch_timing.as_dict())


@pytest.mark.check("vs-torch")
def test_vs_torch(softmax, route, timed_check, ceilings, record, lab_check, seed):
    _against_torch(softmax, route, timed_check, ceilings, record, lab_check, WIDE, seed)


@pytest.mark.check("long-rows-vs-torch")
def test_long_rows_vs_torch(softmax, route, timed_check, ceilings, record, lab_check, seed):
    _against_torch(softmax, route, timed_check, ceilings, record, lab_check, LONG, seed)
