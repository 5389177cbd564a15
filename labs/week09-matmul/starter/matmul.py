"""Week 9: a tiled matrix multiply in Triton, and the roofline arithmetic that says how fast it can go.

Fill in the kernel, its wrapper and the three roofline functions. `infracourse grade week09` checks the
product on odd shapes, three dtypes and strided inputs, the fp32 accumulator, the masks, that your kernel
(not cuBLAS) computed it, your roofline arithmetic, and on a GPU your TFLOP/s against torch.mm.
Run `infracourse hint week09` if stuck.
"""
import os

import torch
import triton
import triton.language as tl

# On a machine without a GPU the grader sets TRITON_INTERPRET=1: Triton's CPU interpreter runs one
# configuration (it cannot autotune) and multiplies bf16 tiles wrongly, so there the tiles are upcast to
# fp32 before tl.dot (UPCAST below; the products of bf16 values are exact in fp32).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _configs():
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4})]
    # TODO(week09): one modest configuration to start from; add larger tiles, stages and warps for the GPU
    # performance checks, and let the autotuner pick per shape.
    return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=3, num_warps=4)]


@triton.autotune(configs=_configs(), key=["M", "N", "K"])
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # TODO(week09): this program computes one BLOCK_M x BLOCK_N tile of C.
    #  1. From tl.program_id(0), find the tile's row pid_m and column pid_n (GROUP_M ordering is optional at
    #     first: pid_m = pid // cdiv(N, BLOCK_N), pid_n = pid % cdiv(N, BLOCK_N) is correct, just slower).
    #  2. Walk K in steps of BLOCK_K: load a tile of A and a tile of B through their strides, upcast both
    #     with .to(tl.float32) when UPCAST, and accumulate tl.dot(a, b, acc, input_precision=PRECISION).
    #     Which accumulator dtype keeps 4096 partial sums exact enough? What must the last, partial K tile load?
    #  3. Store the tile into C, converted to C's dtype. Which rows and columns of the edge tiles do not exist?
    pass


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D fp32, fp16 or bf16 tensors of one dtype, any strides; the result has that dtype."""
    # TODO(week09): allocate C with torch.empty, choose PRECISION ("ieee" for fp32 unless
    # torch.backends.cuda.matmul.allow_tf32 is set, else "tf32"), and launch _matmul_kernel over a grid of
    # lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),) with UPCAST=INTERPRET.
    raise NotImplementedError("matmul(): write _matmul_kernel and launch it (see the TODOs in matmul.py)")


# ---------------------------------------------------------------- the roofline
def arithmetic_intensity(M: int, N: int, K: int, dtype: torch.dtype) -> float:
    """FLOPs per byte of DRAM traffic for C = A @ B when A and B are read once and C written once."""
    # TODO(week09): count the flops of the product and the bytes of the three matrices (dtype.itemsize).
    raise NotImplementedError("arithmetic_intensity(): flops / bytes for one matmul")


def tile_intensity(block_m: int, block_n: int, dtype: torch.dtype) -> float:
    """FLOPs per byte one program loads: a block_m x K panel of A and a K x block_n panel of B."""
    # TODO(week09): the flops one tile does over the bytes it loads; K cancels.
    raise NotImplementedError("tile_intensity(): flops / bytes loaded for one output tile")


def roofline_bound(M: int, N: int, K: int, dtype: torch.dtype, peak_tflops: float,
                   bandwidth_gbps: float) -> tuple[float, str]:
    """The attainable TFLOP/s for this shape on a device, and which roof sets it ("memory" or "compute")."""
    # TODO(week09): min(peak, intensity x bandwidth), and the name of the roof that is lower.
    raise NotImplementedError("roofline_bound(): the lower of the compute and memory roofs")
