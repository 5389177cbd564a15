"""Course code the grading worker runs around a learner's code, for checks that cannot watch from the judge.

The judge never runs learner code (grading/protocol.py), so what must happen next to it runs in the worker:
graders build these with `learner.worker.build(BuildInWorker("infracourse.kit.probes:Name", args))`, passing
the learner's functions (RemoteObjects) as arguments. Everything a probe returns is evidence for the judge
to check against its own reference: learner code shares the worker's process and could change any of it.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from infracourse.kit.gpt import GPT


def cuda_kernels_launched(fn: Callable, *args) -> list[str]:
    """Names of the CUDA kernels the GPU ran during fn(*args), seen by the torch profiler (CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sorted({event.name for event in prof.events()})


def list_after_call(fn: Callable, data: list, *args) -> list:
    """A list made here, beside the learner's code, as fn(that list, *args) left it. A list the judge passes
    reaches the worker as a copy, so only here does a sort in place show."""
    given = list(data)
    fn(given, *args)
    return given


def nvcc_ptx(source: str, arch: str, timeout_s: float = 240) -> dict[str, Any]:
    """Compile `source` (a .cu file) with the flags torch.utils.cpp_extension gives nvcc, minus the Python
    binding (which needs a CUDA build of torch), keeping the PTX. {'nvcc': path or None, 'returncode',
    'stderr', 'ptx'}; a compile that runs past `timeout_s` has returncode None."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return {"nvcc": None, "returncode": None, "stderr": "", "ptx": ""}
    with tempfile.TemporaryDirectory() as tmp:  # in the worker's TMPDIR: the sandbox's own /tmp
        command = [nvcc, *COMMON_NVCC_FLAGS, "-std=c++17", "-O3", f"-arch={arch}", "-c", source,
                   "-o", str(Path(tmp) / "kernel.o"), "--keep", "--keep-dir", tmp]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"nvcc": nvcc, "returncode": None, "stderr": f"nvcc ran past {timeout_s:.0f} s", "ptx": ""}
        ptx = "\n".join(path.read_text() for path in Path(tmp).glob("*.ptx"))
    return {"nvcc": nvcc, "returncode": done.returncode, "stderr": done.stderr[-20000:], "ptx": ptx}


def ptx_entries(ptx: str) -> list[str]:
    """The kernels a PTX file defines."""
    return re.findall(r"\.entry\s+(\w+)", ptx)


class AutogradNode:
    """The autograd node behind fn(*inputs, *extra), its floating inputs made leaves that require grad.

    `grad_fn_type` names the node; `custom` says whether it is a torch.autograd.Function's (its backward
    is the learner's own code); `backward(dy)` calls that node's apply, so a watched call of it observes the
    learner's backward alone."""

    def __init__(self, fn: Callable, inputs: tuple, extra: tuple = ()):
        leaves = [t.detach().requires_grad_() if t.is_floating_point() else t for t in inputs]
        self.output = fn(*leaves, *extra)
        node = getattr(self.output, "grad_fn", None)
        self.grad_fn_type = type(node).__name__ if node is not None else None
        self.custom = isinstance(node, torch.autograd.function.BackwardCFunction)
        self._node = node

    def backward(self, dy):
        if not self.custom:
            raise TypeError(f"the output's grad_fn is {self.grad_fn_type}, not a torch.autograd.Function's")
        return self._node.apply(dy)


class ForwardBackward:
    """A callable (*inputs, dy) -> (y, *gradients of the inputs): fn's forward and backward in one timed call."""

    def __init__(self, fn: Callable, *extra):
        self.fn, self.extra = fn, extra

    def __call__(self, *args):
        *inputs, dy = args
        leaves = [t.detach().requires_grad_() for t in inputs]
        y = self.fn(*leaves, *self.extra)
        return (y.detach(), *torch.autograd.grad(y, leaves, dy))


class GPTTrainer:
    """The course GPT (kit.gpt) with a given norm function (None: its own unfused RMSNorm), on one device.

    Both sides use it: the judge with the unfused norm as the reference, the worker with the learner's."""

    def __init__(self, cfg, norm_fn: Callable | None = None, *, seed: int = 0, device: str = "cpu",
                 dtype: torch.dtype | None = None, lr: float = 1e-4):
        self.model = GPT(cfg, seed=seed, norm_fn=norm_fn).to(device, dtype)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)

    def __call__(self, idx, targets):
        """One training step; the loss before it."""
        self.optimizer.zero_grad(set_to_none=True)
        _, loss = self.model(idx, targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def loss(self, idx, targets) -> float:
        with torch.no_grad():
            return self.model(idx, targets)[1].item()

    def gradients(self, idx, targets) -> tuple[float, dict[str, Any]]:
        """(loss, {parameter name: gradient or None}) of one forward and backward, without a step."""
        self.model.zero_grad(set_to_none=True)
        _, loss = self.model(idx, targets)
        loss.backward()
        return loss.item(), {name: p.grad for name, p in self.model.named_parameters()}

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def set_tf32(allow: bool) -> bool:
    """Set torch.backends.cuda.matmul.allow_tf32 where the learner's matmul reads it; returns the new value."""
    torch.backends.cuda.matmul.allow_tf32 = bool(allow)
    return torch.backends.cuda.matmul.allow_tf32
