"""Verdicts: what the judge decides from what the worker observed of a learner's call (see infracourse.observe).

- `run_watched` calls a learner function in the worker with its allocations poisoned and fails a store out of
  bounds, a changed input, a computing torch op, no kernel, or an answer that never flowed through a kernel.
- `fenced` / `explain_nan` build inputs with NaN past their ends and say why NaN came out.
- `require_plain_tensor` rejects lazy, subclassed, sparse, nested or misplaced outputs.
- `require_possible` rejects times faster than this device's measured ceilings allow.
Timing-side defences (fresh inputs, side streams) live in `bench.measure` and `grading.perf`.
"""
from __future__ import annotations

from typing import Any, Callable

from infracourse.failures import LabCheckFailed
from infracourse.grading.provenance import require_kernel_reached
from infracourse.grading.remote import RemoteObject, origin_of
from infracourse.observe import CANARY_ELEMENTS, CallRecord


def require_own_kernel(fn, graded: str | None = None, *, backward: bool = False) -> None:
    """Fail unless the learner's files are clean and the graded function reaches a `@triton.jit` kernel launch in
    its own call graph (grading.provenance.require_kernel_reached: the judge's reading, not the worker's record).

    `fn` is the learner's function as the judge holds it (`ops.add`); `graded` ('vector_ops.add') defaults to the
    name it was reached by. An object a course probe built in the worker (kit.probes.ForwardBackward) has no such
    name: its files are still scanned. perf.timed(require_kernel=True) calls it after the timed batch's checks."""
    if not isinstance(fn, RemoteObject):  # fail closed: only a learner object has files to read
        raise TypeError(f"require_own_kernel reads a learner function's files, not {type(fn).__name__}'s")
    learner_dir, native_code, reached_as = origin_of(fn)
    require_kernel_reached(learner_dir, graded or reached_as, native_code=native_code, backward=backward)


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


def explain_nan(fn: Callable[..., Any], args: tuple, *, name: str, what: str, never_written: str,
                past_end: str) -> None:
    """Raise the real cause of NaN in an output computed from fenced inputs (NaN just past each input's end) into
    poisoned outputs (they start as NaN): called again on plain copies of the inputs, NaN that stays is an element
    the kernel never wrote, NaN that goes was read from past an input's end. `never_written` and `past_end` say
    what to do about each."""
    import torch

    plain = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    again = run_watched(fn, *plain, name=name, require_kernel=False)
    nan = torch.isnan(again) if isinstance(again, torch.Tensor) else None
    if nan is not None and nan.any():
        first = nan.nonzero()[0].tolist()
        raise LabCheckFailed(f"{what}: {int(nan.sum())} output element(s) never written (first at {first}; outputs "
                             f"start as NaN here). {never_written}")
    raise LabCheckFailed(f"{what}: NaN in the output, read from past the end of an input (NaN lies just beyond each "
                         f"input here). {past_end}")


def run_watched(fn: RemoteObject, *args, allowed: frozenset[str] = frozenset(), name: str = "your function",
                replaces: str = "the library op", require_kernel: bool = True) -> Any:
    """Call the learner function `fn` (in the grading worker) with poisoned allocations; fail on a store out of
    bounds or a changed input and, with `require_kernel`, unless a Triton kernel ran and no computing torch op did.

    The worker observes the call (infracourse.observe) and this side judges what it reports."""
    if not isinstance(fn, RemoteObject):
        raise TypeError(f"run_watched judges a learner function in the grading worker, not {type(fn).__name__}: "
                        "pass an object of the `learner` fixture")
    result = fn.call(args, watch={"poison": True})
    out, record = result.value, CallRecord.from_evidence(result.record)
    if record.inputs_modified:
        raise LabCheckFailed(f"{name} modified its input (argument {record.inputs_modified[0]}): write the "
                             "result into a new tensor and leave the inputs as they were")
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
    require_data_flow(record, args, name)
    require_own_kernel(fn)  # records made beside learner code pass only with the judge's reading of it
    return out


def require_data_flow(record: CallRecord, args: tuple, name: str) -> None:
    """The answer must flow through the kernels: every non-empty tensor argument (or a view or copy made of it
    in the call) was passed to a launched kernel, and so was the output's storage."""
    import torch

    unread = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel() and i not in record.inputs_read]
    if unread:
        raise LabCheckFailed(f"{name}: no kernel you launched was given argument {unread[0]} (nor a view or copy of "
                             "it): the answer was computed some other way (on the host, or by torch) and the kernel "
                             "only moved it. Pass the input tensors to your kernel and compute there.")
    if record.output_written is False:
        raise LabCheckFailed(f"{name}: the tensor you returned was never given to a kernel you launched: return the "
                             "output buffer your kernel stored into.")


def interpreter_note(dtype) -> str:
    """For a bf16 failure graded under Triton's interpreter (no GPU): say that the interpreter, not the GPU, is
    where bf16 arithmetic goes wrong, and what to do. Empty otherwise."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or "bfloat16" not in str(dtype):
        return ""
    return (" This machine runs Triton's CPU interpreter (no GPU), which computes wrongly on bf16 values (and "
            "tl.dot on bf16 tiles) in Triton 3.x, an interpreter-only fault: upcast with .to(tl.float32) right "
            "after tl.load (under TRITON_INTERPRET=1 at least) and store with .to(ptr.dtype.element_ty).")


def require_plain_tensor(out: Any, *, like: Any = None, shape=None, dtype=None, device=None, what: str = "output"):
    """The output must be a real torch.Tensor (not a subclass or lazy wrapper) with the expected metadata."""
    import torch

    if type(out) is not torch.Tensor:
        raise LabCheckFailed(f"{what} is a {type(out).__name__}, not a plain torch.Tensor: return the tensor "
                             "your kernel wrote into (subclasses and lazy wrappers are not accepted)")
    if out.layout != torch.strided or out.is_nested:
        raise LabCheckFailed(f"{what} is a {'nested' if out.is_nested else out.layout} tensor: return a dense "
                             "tensor holding every value")
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
