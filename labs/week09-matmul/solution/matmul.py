"""Week 9: a tiled matrix multiply in Triton, and the roofline arithmetic that says how fast it can go
(reference solution)."""
import functools
import os

import torch
import triton
import triton.language as tl

# On a machine without a GPU the grader sets TRITON_INTERPRET=1: Triton's CPU interpreter runs one
# configuration (it cannot autotune) and multiplies bf16 tiles wrongly, so there the tiles are upcast to
# fp32 before tl.dot (the products of bf16 values are exact in fp32, so nothing is lost).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# Large tiles give each program many flops per byte it loads (tile_intensity below); 3-4 stages keep the next
# tiles' loads in flight while tensor cores work on the current ones. Every configuration costs a compile
# (~1 s on the H200) and a benchmark for each new key, so the list keeps one per tile shape: two wide tiles for
# the large squares, a middle one, and two small ones that fp32 (whose stages take twice the shared memory)
# and skinny products fall back to.
CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=5, num_warps=2),
]
# Small products, where large tiles leave most of the device idle, take the smallest tiles untuned: the
# autotuner benchmarks every new (M, N, K) (~0.1-1 s each), which buys nothing for a product of microseconds.
# The interpreter cannot autotune and gets small tiles too (32x32, GROUP_M 4: fewer interpreted programs).
SMALL = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4) if INTERPRET else \
    dict(CONFIGS[-1].kwargs, num_stages=CONFIGS[-1].num_stages, num_warps=CONFIGS[-1].num_warps)
SMALL_PRODUCT = 256 * 256  # elements of C


def _fitting(configs, named_args, **kwargs):
    """The tiles that fit C (a tile much larger than C only computes padding) and the device's shared memory
    (each pipeline stage holds a BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N tile of B: a config that
    needs more fails to launch, and compiling it only to find that out costs a second or two)."""
    M, N, a = named_args["M"], named_args["N"], named_args["a_ptr"]
    limit = _shared_memory(a.device.index if a.device.index is not None else torch.cuda.current_device())

    def fits(config):
        tiles, stages = config.kwargs, config.num_stages
        staged = (tiles["BLOCK_M"] + tiles["BLOCK_N"]) * tiles["BLOCK_K"] * a.element_size() * stages
        return tiles["BLOCK_M"] <= 2 * M and tiles["BLOCK_N"] <= 2 * N and staged <= limit
    return [c for c in configs if fits(c)] or configs[-1:]


@functools.cache
def _shared_memory(device: int) -> int:
    return triton.runtime.driver.active.utils.get_device_properties(device)["max_shared_mem"]


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Each program computes one BLOCK_M x BLOCK_N tile of C. Consecutive program ids walk down a group of
    # GROUP_M tile-rows before moving right, so programs running at the same time share A's row panels and
    # B's column panels in L2 instead of each fetching its own from DRAM.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    first_m = (pid // (GROUP_M * tiles_n)) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_rows)
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows

    # Rows and columns past the edge of C wrap around (% M, % N): their loads stay inside A and B and their
    # results are never stored, so the loop needs no mask on M or N. K is different: a partial last K tile
    # would add products of elements that do not belong to this dot product.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BLOCK_M, BLOCK_K)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # (BLOCK_K, BLOCK_N)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # fp32 whatever the inputs: K partial sums add up
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        # masked-off elements load as 0, so the partial last tile adds nothing beyond K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


# PRECISION is part of the key: an fp32 tile that fits in shared memory as ieee may not as tf32. Each
# configuration is timed over ~20 ms, not Triton's default ~125 ms: the wide tiles differ by far more than
# that much timing can blur, and a grade meets some 15 new keys.
_tuned_kernel = triton.autotune(configs=CONFIGS, key=["M", "N", "K", "PRECISION"],
                                prune_configs_by={"early_config_prune": _fitting},
                                do_bench=lambda call, quantiles: triton.testing.do_bench(
                                    call, warmup=5, rep=20, quantiles=quantiles))(_matmul_kernel)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D fp32, fp16 or bf16 tensors of one dtype, any strides; the result has that dtype."""
    assert a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0], f"cannot multiply {a.shape} by {b.shape}"
    assert a.dtype == b.dtype and a.device == b.device, "a and b need one dtype and one device"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if c.numel() == 0:
        return c
    # fp32 follows torch's rule: tf32 tensor cores only when torch.backends.cuda.matmul.allow_tf32 is set,
    # otherwise full fp32 ("ieee"). fp16 and bf16 tiles always go to tensor cores; the setting is theirs alone.
    exact_fp32 = a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    small = INTERPRET or M * N < SMALL_PRODUCT
    kernel, tiles = (_matmul_kernel, SMALL) if small else (_tuned_kernel, {})
    kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                 PRECISION="ieee" if exact_fp32 else "tf32", UPCAST=INTERPRET, **tiles)
    return c


# ---------------------------------------------------------------- the roofline
def arithmetic_intensity(M: int, N: int, K: int, dtype: torch.dtype) -> float:
    """FLOPs per byte of DRAM traffic for C = A @ B when A and B are read once and C written once."""
    flops = 2 * M * N * K  # a multiply and an add per (m, n, k)
    moved = (M * K + K * N + M * N) * dtype.itemsize
    return flops / moved


def tile_intensity(block_m: int, block_n: int, dtype: torch.dtype) -> float:
    """FLOPs per byte one program loads: a block_m x K panel of A and a K x block_n panel of B feed
    2 * block_m * block_n * K flops, so K cancels. Larger tiles reuse each loaded element more often."""
    return 2 * block_m * block_n / ((block_m + block_n) * dtype.itemsize)


def roofline_bound(M: int, N: int, K: int, dtype: torch.dtype, peak_tflops: float,
                   bandwidth_gbps: float) -> tuple[float, str]:
    """The attainable TFLOP/s for this shape on a device, and which roof sets it ("memory" or "compute")."""
    memory_roof = arithmetic_intensity(M, N, K, dtype) * bandwidth_gbps / 1e3  # FLOP/B x GB/s = GFLOP/s
    if memory_roof < peak_tflops:
        return memory_roof, "memory"
    return peak_tflops, "compute"
