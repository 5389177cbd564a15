"""Week 8: the answers come from the learner's own kernel.

Triton route: a Triton kernel launched and no torch op computed (guard.run_watched).
CUDA C++ route on a GPU: no torch op computed (a watched call in the worker), and a __global__ function of
softmax_cuda.cu ran (the profiler, run in the worker around the learner's call: kit.probes).
CUDA C++ route on a CPU: softmax_cuda.cu compiles with nvcc, as torch.utils.cpp_extension would compile its
kernel part, and the compiled kernel loads, exponentiates and stores; failed when it does not, and blocked when it
does (or where there is no nvcc): no answer of the kernel was checked here, so the week is not complete on a CPU. nvcc
runs in the worker too: compiling the learner's source is running their build, which stays in the sandbox.
Either route passes only when the judge's own reading of the learner's files (grading.provenance) finds no
construct that reaches the worker's records, and, on the Triton route, softmax reaching a kernel launch.
"""
import re

import pytest
import torch

from infracourse.grader import CallRecord, LabCheckFailed, blocked, require_clean_sources, run_watched
from infracourse.kit import probes
from infracourse.kit.probes import ptx_entries

NVCC_ARCH = "sm_80"  # the oldest GPUs with bf16 arithmetic; the GPU build targets the learner's own device


@pytest.mark.check("kernel-did-work")
def test_kernel_did_work(module, route, device, learner):
    if route == "triton":
        for shape in [(64, 1000), (2, 40000)]:
            run_watched(module.softmax, torch.randn(shape, device=device), name="softmax", replaces="torch.softmax")
    elif device == "cuda":
        _cuda_kernel_ran(module, learner)
    else:
        _compile_check(learner)
    if route == "cuda":  # the worker's records and probes pass only with the judge's reading of the files
        require_clean_sources(learner.root)
    if route == "cuda" and device != "cuda":
        # A compile check is no check of the answers: with every answer check blocked here, a pass would let the
        # week read complete on a machine where the learner's kernel never ran once (results.GradeResult.complete).
        blocked("softmax_cuda.cu compiles with nvcc and its kernel loads, exponentiates and stores, but the CUDA "
                "C++ route (BACKEND = \"cuda\") runs only on a CUDA GPU: that its answers come from your kernel is "
                "checked there. To be graded on this machine, take the Triton route (BACKEND = \"triton\").")


def _global_functions(source: str) -> set[str]:
    text = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", source)
    return set(re.findall(r"__global__\s+(?:\w+\s+)*?(\w+)\s*\(", text))


def _cuda_kernel_ran(module, learner) -> None:
    softmax = module.softmax
    x = torch.randn(64, 1000, device="cuda")
    softmax(x)  # builds the extension outside the watch, if it was not built yet
    record = CallRecord.from_evidence(softmax.call((x,), watch={"poison": True}).record)
    if record.inputs_modified:
        raise LabCheckFailed("softmax modified its input: write the result into a new tensor")
    computed = record.compute_ops()
    if computed:
        raise LabCheckFailed(f"softmax called torch compute ops {computed}: the answer must come from your kernel in "
                             "softmax_cuda.cu, not from torch.softmax or other torch ops")
    launched = learner.build(probes.cuda_kernels_launched, softmax, x)
    if not isinstance(launched, list):
        raise LabCheckFailed(f"the profiler in the grading worker reported {type(launched).__name__}, not a list "
                             "of kernel names")
    ours = _global_functions(learner.path("softmax_cuda.cu").read_text())
    if not launched:
        raise LabCheckFailed("the profiler saw no CUDA kernel at all during softmax (is CUPTI available?): "
                             "cannot confirm that your kernel ran")
    if not any(name in str(kernel) for kernel in launched for name in ours):
        raise LabCheckFailed(f"none of the kernels in softmax_cuda.cu ({sorted(ours) or 'no __global__ function'}) "
                             f"ran during softmax; the GPU ran {[str(k) for k in launched[:5]]}. Launch your own "
                             "kernel.")


def _compile_check(learner) -> None:
    source = learner.path("softmax_cuda.cu")
    if not source.exists():
        raise LabCheckFailed("softmax_cuda.cu is missing from your week folder: restore it with `infracourse reset`")
    built = learner.build(probes.nvcc_ptx, str(source), NVCC_ARCH)
    if not isinstance(built, dict):
        raise LabCheckFailed(f"the compile check in the grading worker reported {type(built).__name__}")
    if built.get("nvcc") is None:
        blocked("compile-checking softmax_cuda.cu needs nvcc (the CUDA toolkit) on PATH; "
                "this machine has none")
    stderr, ptx = str(built.get("stderr", "")), str(built.get("ptx", ""))
    if built.get("returncode") != 0:
        errors = "\n".join(line for line in stderr.splitlines() if "error" in line)[-1500:]
        raise LabCheckFailed(f"softmax_cuda.cu does not compile with nvcc:\n{errors or stderr[-1500:]}")
    if not ptx_entries(ptx):
        raise LabCheckFailed("softmax_cuda.cu compiles but no kernel is instantiated: softmax_forward must launch your "
                             "__global__ kernel for float, __half and __nv_bfloat16")
    needed = {"ld.global": "loads nothing from x", "st.global": "stores nothing to y",
              "ex2.approx": "computes no exponential (expf)"}
    missing = [meaning for instruction, meaning in needed.items() if instruction not in ptx]
    if missing:
        raise LabCheckFailed(f"softmax_cuda.cu compiles, but its kernel {' and '.join(missing)}: write the kernel "
                             "(see the TODOs)")
