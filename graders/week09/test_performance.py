"""Week 9 performance on a GPU: TFLOP/s against cuBLAS (torch.mm) on the same device, timed the same way."""
import pytest
import torch

from infracourse.grader import (LabCheckFailed, dtype_name, reference_time, relative_error, require_fraction, tensors,
                                timed)


# (M, K, N) for the sweep: where a plain tiled kernel wins, ties and loses against the vendor library
SWEEP = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4097, 4097, 4097), (16, 8192, 8192),
         (8192, 8192, 16), (4096, 64, 4096)]


def _race(mm, M, K, N, dtype, ceilings, error_bound, seed):
    """Time the learner's matmul (in the worker) and torch.mm (here) on fresh inputs of one shape."""
    spec = tensors([[M, K], [K, N]], dtype=dtype_name(dtype), seed=seed)

    def check(out, args):
        err = relative_error(out, args[0].float() @ args[1].float())
        if not err <= error_bound(dtype):
            raise LabCheckFailed(f"a timed matmul output ({M}x{K}) @ ({K}x{N}) has relative error {err:.2e} > "
                                 f"{error_bound(dtype):.0e}: timed calls must compute the product too")

    flops, moved = 2 * M * N * K, (M * K + K * N + M * N) * dtype.itemsize
    yours = timed(mm.matmul, spec, check=check, flops=flops, bytes_moved=moved, ceilings=ceilings,
                  label=f"matmul ({M}x{K}) @ ({K}x{N})", require_kernel=True)
    cublas = reference_time(torch.mm, spec)
    return yours, cublas, flops, moved


def _figures(record, label, flops, moved, yours, cublas, ceilings):
    """`record` with what the grade's plots need: the kernel, its work and traffic, both times, the ceilings."""
    def _record(name, value, **extra):
        record(name, value, label=label, flops=flops, bytes=moved, seconds=yours.seconds,
               reference_seconds=cublas.seconds, reference="torch.mm (cuBLAS)",
               peak_tflops=ceilings.matmul_tflops.get("bfloat16"), copy_gbps=ceilings.copy_gbps, **extra)

    return _record


@pytest.mark.parametrize("n", [pytest.param(4096, marks=pytest.mark.check("cublas-4096")),
                               pytest.param(8192, marks=pytest.mark.check("cublas-8192"))])
def test_against_cublas(mm, n, ceilings, record, lab_check, error_bound, seed):
    yours, cublas, flops, moved = _race(mm, n, n, n, torch.bfloat16, ceilings, error_bound, seed)
    require_fraction(flops / yours.seconds / 1e12, flops / cublas.seconds / 1e12, lab_check.threshold,
                     unit="TFLOP/s", what=f"bf16 matmul {n}x{n}x{n} against cuBLAS (torch.mm) on this device",
                     record=_figures(record, f"matmul {n}x{n}x{n} bf16", flops, moved, yours, cublas, ceilings),
                     name=f"TFLOP/s at {n}^3 bf16")


@pytest.mark.check("shape-sweep")
def test_shape_sweep(mm, ceilings, record, error_bound, seed):
    # No target: the figures are the learner's raw data for the report (one shape that gains, one that
    # regresses). The check fails on a wrong timed output or a timing that cannot be trusted.
    for M, K, N in SWEEP:
        yours, cublas, flops, moved = _race(mm, M, K, N, torch.bfloat16, ceilings, error_bound, seed)
        _figures(record, f"matmul {M}x{K}x{N} bf16", flops, moved, yours, cublas, ceilings)(
            f"{M}x{K}x{N} bf16", flops / yours.seconds / 1e12, unit="TFLOP/s",
            ratio_to_reference=cublas.seconds / yours.seconds, shape=[M, K, N])
