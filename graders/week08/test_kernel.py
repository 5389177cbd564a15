"""Week 8: the answers come from the learner's own kernel.

Triton route: a Triton kernel launched and no torch op computed (guard.run_watched).
CUDA C++ route on a GPU: no torch op computed, and a __global__ function of softmax_cuda.cu ran (profiler).
CUDA C++ route on a CPU: softmax_cuda.cu compiles with nvcc, as torch.utils.cpp_extension would compile its
kernel part, and the compiled kernel loads, exponentiates and stores; blocked where there is no nvcc.
"""
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from infracourse.grading.plugin import BLOCKED_PREFIX
from infracourse.guard import LabCheckFailed, run_watched, watch_call

NVCC_ARCH = "sm_80"  # the oldest GPUs with bf16 arithmetic; the GPU build targets the learner's own device


@pytest.mark.check("kernel-did-work")
def test_kernel_did_work(module, route, device, learner):
    if route == "triton":
        for shape in [(64, 1000), (2, 40000)]:
            run_watched(module.softmax, torch.randn(shape, device=device), name="softmax", replaces="torch.softmax")
    elif device == "cuda":
        _cuda_kernel_ran(module, learner.path("softmax_cuda.cu"))
    else:
        _compile_check(learner.path("softmax_cuda.cu"))


def _global_functions(source: str) -> set[str]:
    text = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", source)
    return set(re.findall(r"__global__\s+(?:\w+\s+)*?(\w+)\s*\(", text))


def _cuda_kernel_ran(module, source: Path) -> None:
    x = torch.randn(64, 1000, device="cuda")
    module.softmax(x)  # builds the extension outside the watch, if it was not built yet
    torch.cuda.synchronize()
    with watch_call() as record:
        module.softmax(x)
    computed = record.compute_ops()
    if computed:
        raise LabCheckFailed(f"softmax called torch compute ops {computed}: the answer must come from your kernel in "
                             "softmax_cuda.cu, not from torch.softmax or other torch ops")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        module.softmax(x)
        torch.cuda.synchronize()
    launched = {event.name for event in prof.events()}
    ours = _global_functions(source.read_text())
    if not launched:
        raise LabCheckFailed("the profiler saw no CUDA kernel at all during softmax (is CUPTI available?): "
                             "cannot confirm that your kernel ran")
    if not any(name in kernel for kernel in launched for name in ours):
        raise LabCheckFailed(f"none of the kernels in softmax_cuda.cu ({sorted(ours) or 'no __global__ function'}) "
                             f"ran during softmax; the GPU ran {sorted(launched)[:5]}. Launch your own kernel.")


def _compile_check(source: Path) -> None:
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip(BLOCKED_PREFIX + "compile-checking softmax_cuda.cu needs nvcc (the CUDA toolkit) on PATH; "
                    "this machine has none")
    if not source.exists():
        raise LabCheckFailed("softmax_cuda.cu is missing from your week folder: restore it with `infracourse reset`")
    with tempfile.TemporaryDirectory() as tmp:
        # The flags torch.utils.cpp_extension gives nvcc, without TORCH_EXTENSION_NAME: the Python binding
        # (which needs a CUDA build of torch) is left out, the kernels and their launcher are compiled.
        command = [nvcc, *COMMON_NVCC_FLAGS, "-std=c++17", "-O3", f"-arch={NVCC_ARCH}", "-c", str(source),
                   "-o", str(Path(tmp) / "softmax_cuda.o"), "--keep", "--keep-dir", tmp]
        done = subprocess.run(command, capture_output=True, text=True, timeout=240)
        if done.returncode != 0:
            errors = "\n".join(line for line in done.stderr.splitlines() if "error" in line)[-1500:]
            raise LabCheckFailed(f"softmax_cuda.cu does not compile with nvcc:\n{errors or done.stderr[-1500:]}")
        ptx = "\n".join(path.read_text() for path in Path(tmp).glob("*.ptx"))
    kernels = re.findall(r"\.entry\s+(\w+)", ptx)
    if not kernels:
        raise LabCheckFailed("softmax_cuda.cu compiles but no kernel is instantiated: softmax_forward must launch your "
                             "__global__ kernel for float, __half and __nv_bfloat16")
    needed = {"ld.global": "loads nothing from x", "st.global": "stores nothing to y",
              "ex2.approx": "computes no exponential (expf)"}
    missing = [meaning for instruction, meaning in needed.items() if instruction not in ptx]
    if missing:
        raise LabCheckFailed(f"softmax_cuda.cu compiles, but its kernel {' and '.join(missing)}: write the kernel "
                             "(see the TODOs)")
