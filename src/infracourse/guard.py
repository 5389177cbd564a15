"""Defences against the known ways a kernel lab can be fooled, shared by every kernel grader.

- `watch_call` records the aten ops dispatched and the Triton kernels launched during the learner's call:
  a softmax lab that calls torch.softmax, or an add that computes with torch and launches a dummy kernel,
  is caught by the ops it dispatched.
- `require_plain_tensor` rejects lazy, subclassed or misplaced outputs.
- `require_possible` rejects times faster than this device's measured ceilings allow.
Timing-side defences (fresh inputs, side streams) live in `bench.measure`.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

# Ops that move or allocate memory without computing an answer: allowed inside a learner's kernel wrapper.
MEMORY_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view", "_unsafe_view",
    "reshape", "_reshape_alias", "as_strided", "contiguous", "clone", "copy_", "_to_copy", "to", "t",
    "transpose", "permute", "expand", "select", "slice", "unsqueeze", "squeeze", "flatten", "detach",
    "alias", "lift_fresh", "unbind", "split", "narrow", "resize_", "zeros", "zeros_like", "zero_", "fill_",
    "full", "full_like", "set_", "is_same_size", "stride", "size", "numel", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "_local_scalar_dense", "item", "clamp_min", "empty_permuted",
})


class LabCheckFailed(AssertionError):
    """A check failed; the message teaches what was wrong."""


_state = threading.local()


ALLOCATION_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                            "empty_permuted"})
CANARY = -1234.0  # written around every poisoned allocation; a changed canary is an out-of-bounds store
CANARY_ELEMENTS = 4096


@dataclass
class CallRecord:
    ops: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    allocations: list[tuple[Any, int, int]] = field(default_factory=list)  # (buffer, start, length)

    def compute_ops(self, allowed: frozenset[str] = MEMORY_OPS) -> list[str]:
        return sorted({op for op in self.ops if op not in allowed})

    def out_of_bounds_writes(self) -> int:
        """Elements changed in the canary zones around the poisoned allocations."""
        changed = 0
        for buffer, start, length in self.allocations:
            for zone in (buffer[:start], buffer[start + length:]):
                changed += int((zone != CANARY).sum())
        return changed


def poisoned_allocation(out):
    """A tensor like `out` whose elements are NaN and whose storage is fenced by canaries on both sides."""
    import torch

    length = out.untyped_storage().nbytes() // out.element_size()
    buffer = torch.full((length + 2 * CANARY_ELEMENTS,), CANARY, dtype=out.dtype, device=out.device)
    buffer[CANARY_ELEMENTS:CANARY_ELEMENTS + length] = float("nan")
    view = buffer.as_strided(out.shape, out.stride(), CANARY_ELEMENTS + out.storage_offset())
    return view, (buffer, CANARY_ELEMENTS, length)


def fenced(tensor):
    """A copy of `tensor` (same values, shape and strides) with NaN on both sides of its storage.

    A kernel that reads past the end without a mask picks up NaN, which shows in its result.
    """
    import torch

    length = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    buffer = torch.full((length + 2 * CANARY_ELEMENTS,), float("nan"), dtype=tensor.dtype, device=tensor.device)
    view = buffer.as_strided(tensor.shape, tensor.stride(), CANARY_ELEMENTS)
    view.copy_(tensor)
    return view


def _in_kernel() -> bool:
    return getattr(_state, "depth", 0) > 0


def _install_triton_hooks() -> None:
    """Count launches of Triton kernels; while one runs, its own tensor traffic is not the learner's."""
    if getattr(_install_triton_hooks, "done", False):
        return
    try:
        from triton.runtime import autotuner, interpreter, jit
    except ImportError:
        return
    classes = [jit.JITFunction, interpreter.InterpretedFunction, autotuner.Autotuner, autotuner.Heuristics]
    for cls in classes:
        original = cls.run
        counts = cls in (jit.JITFunction, interpreter.InterpretedFunction)

        def run(self, *args, _original=original, _counts=counts, **kwargs):
            if _counts and not kwargs.get("warmup", False):
                for record in getattr(_state, "records", []):
                    record.kernels.append(getattr(self, "__name__", type(self).__name__))
            _state.depth = getattr(_state, "depth", 0) + 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                _state.depth -= 1

        cls.run = run
    _install_triton_hooks.done = True


@contextmanager
def watch_call(poison: bool = True):
    """Record aten ops and Triton launches made inside the block: `with watch_call() as rec: f(x)`.

    With `poison`, floating-point tensors allocated inside the block start as NaN (an element the kernel
    never writes stays NaN) and are fenced by canaries (a store past the end changes one).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    _install_triton_hooks()
    record = CallRecord()

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if _in_kernel():
                return out
            name = func._overloadpacket.__name__
            record.ops.append(name)
            if poison and name in ALLOCATION_OPS and out.is_floating_point() and out.numel():
                out, fence = poisoned_allocation(out)
                record.allocations.append(fence)
            return out

    _state.records = getattr(_state, "records", []) + [record]
    try:
        with _Recorder():
            yield record
    finally:
        _state.records = [r for r in _state.records if r is not record]


def run_watched(fn: Callable[..., Any], *args, allowed: frozenset[str] = MEMORY_OPS, name: str = "your function",
                replaces: str = "the library op", require_kernel: bool = True) -> Any:
    """Call fn with poisoned allocations; fail on a store out of bounds and, with `require_kernel`, unless a
    Triton kernel ran and no computing torch op did."""
    with watch_call() as record:
        out = fn(*args)
    stray = record.out_of_bounds_writes()
    if stray:
        raise LabCheckFailed(f"{name} wrote {stray} element(s) outside the buffers it allocated: a store past the "
                             "end of the output. Mask the store (mask=offsets < n) so the last block stops at n.")
    if not require_kernel:
        return out
    computed = record.compute_ops(allowed)
    if computed:
        raise LabCheckFailed(
            f"{name} called torch compute ops {computed}: the answer must come from your own kernel, "
            f"not from {replaces}. Allocate outputs with torch.empty and launch your kernel instead.")
    if not record.kernels:
        raise LabCheckFailed(f"{name} launched no Triton kernel: write the computation as a @triton.jit kernel "
                             "and launch it with kernel[grid](...).")
    return out


def require_plain_tensor(out: Any, *, like: Any = None, shape=None, dtype=None, device=None, what: str = "output"):
    """The output must be a real torch.Tensor (not a subclass or lazy wrapper) with the expected metadata."""
    import torch

    if type(out) is not torch.Tensor:
        raise LabCheckFailed(f"{what} is a {type(out).__name__}, not a plain torch.Tensor: return the tensor "
                             "your kernel wrote into (subclasses and lazy wrappers are not accepted)")
    if like is not None:
        shape, dtype, device = like.shape, like.dtype, like.device
    problems = []
    if shape is not None and tuple(out.shape) != tuple(shape):
        problems.append(f"shape {tuple(out.shape)} (expected {tuple(shape)})")
    if dtype is not None and out.dtype != dtype:
        problems.append(f"dtype {out.dtype} (expected {dtype})")
    if device is not None and out.device.type != torch.device(device).type:
        problems.append(f"device {out.device} (expected {device})")
    if out.is_meta or problems:
        raise LabCheckFailed(f"{what} has " + ", ".join(problems or ["no data (meta tensor)"]))
    return out


def require_possible(seconds: float, *, bytes_moved: float = 0, flops: float = 0, copy_gbps: float | None = None,
                     peak_tflops: float | None = None, slack: float = 1.5) -> None:
    """Fail a time that beats this device's measured ceilings by more than `slack` (it did not do the work)."""
    floors = []
    if bytes_moved and copy_gbps:
        floors.append(bytes_moved / (copy_gbps * 1e9 * slack))
    if flops and peak_tflops:
        floors.append(flops / (peak_tflops * 1e12 * slack))
    floor = max(floors, default=0.0)
    if seconds < floor:
        raise LabCheckFailed(
            f"measured {seconds * 1e6:.1f} us, but moving {bytes_moved / 1e6:.1f} MB / doing {flops / 1e9:.2f} GFLOP "
            f"takes at least {floor * 1e6:.1f} us on this device: the timed call did not do the work "
            "(work on another stream, a cached result, or a skipped computation)")
