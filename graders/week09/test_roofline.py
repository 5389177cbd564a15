"""Week 9 roofline: the learner's arithmetic intensity and attainable rate, checked against the definitions."""
import math

import pytest
import torch

from infracourse.grader import LabCheckFailed


# (M, N, K, dtype): square (compute-bound on any GPU), skinny M (a decode step: memory-bound), small K,
# and fp32, where each element costs twice the bytes.
SHAPES = [(4096, 4096, 4096, torch.bfloat16), (8192, 8192, 8192, torch.float16), (1, 4096, 4096, torch.bfloat16),
          (16, 8192, 8192, torch.float16), (4096, 4096, 64, torch.bfloat16), (1000, 3000, 2000, torch.float32),
          (33, 45, 40, torch.float32)]
TILES = [(128, 256, torch.bfloat16), (64, 64, torch.float16), (32, 32, torch.float32), (16, 256, torch.bfloat16)]
# (peak TFLOP/s, bandwidth GB/s): an H200 in bf16, the same device in fp32 without tensor cores, a laptop GPU
DEVICES = [(700.0, 4200.0), (50.0, 4200.0), (20.0, 250.0)]


def intensity(M, N, K, dtype):
    return 2 * M * N * K / ((M * K + K * N + M * N) * dtype.itemsize)


def _same(got, expected, call, how):
    if not isinstance(got, (int, float)) or not math.isclose(got, expected, rel_tol=1e-6):
        raise LabCheckFailed(f"{call} returned {got!r}; expected {expected:.6g}. {how}")


@pytest.mark.check("roofline")
def test_roofline(mm, record):
    for M, N, K, dtype in SHAPES:
        _same(mm.arithmetic_intensity(M, N, K, dtype), intensity(M, N, K, dtype),
              f"arithmetic_intensity({M}, {N}, {K}, {dtype})",
              "Count 2*M*N*K flops (a multiply and an add per term) over the bytes of A and B read once and C "
              "written once, at dtype.itemsize bytes per element.")
    for block_m, block_n, dtype in TILES:
        expected = 2 * block_m * block_n / ((block_m + block_n) * dtype.itemsize)
        _same(mm.tile_intensity(block_m, block_n, dtype), expected,
              f"tile_intensity({block_m}, {block_n}, {dtype})",
              "One program loads a block_m x K panel of A and a K x block_n panel of B and does "
              "2 * block_m * block_n * K flops with them: K cancels.")
    for M, N, K, dtype in SHAPES:
        for peak, bandwidth in DEVICES:
            memory_roof = intensity(M, N, K, dtype) * bandwidth / 1e3
            expected = (memory_roof, "memory") if memory_roof < peak else (peak, "compute")
            call = f"roofline_bound({M}, {N}, {K}, {dtype}, peak_tflops={peak}, bandwidth_gbps={bandwidth})"
            got = mm.roofline_bound(M, N, K, dtype, peak, bandwidth)
            if not isinstance(got, tuple) or len(got) != 2:
                raise LabCheckFailed(f"{call} returned {got!r}: return a pair (attainable TFLOP/s, 'memory' or "
                                     "'compute')")
            _same(got[0], expected[0], call, "The attainable rate is min(peak, intensity x bandwidth): FLOP/byte x "
                  "GB/s is GFLOP/s, so divide by 1000 for TFLOP/s.")
            if got[1] != expected[1]:
                raise LabCheckFailed(f"{call} says {got[1]!r}-bound; at {intensity(M, N, K, dtype):.1f} FLOP/byte the "
                                     f"{expected[1]} roof is the lower one (ridge point "
                                     f"{peak * 1e3 / bandwidth:.0f} FLOP/byte)")
    record("intensity bf16 4096^3", intensity(4096, 4096, 4096, torch.bfloat16), unit="FLOP/byte")
