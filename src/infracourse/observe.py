"""Observation: the instrumentation that runs beside the learner's call, inside the grading worker.

- `watch_call` records the aten ops dispatched and the Triton kernels launched during the learner's call:
  a softmax lab that calls torch.softmax, or an add that computes with torch and launches a dummy kernel,
  is caught by the ops it dispatched. Two observers see each call: a TorchDispatchMode (which also poisons
  allocations) and the torch profiler on every thread, which still sees ops run with the dispatch mode
  switched off, on another thread, or from C++ (an extension calling at::softmax).
- `record_launches` sees only the Triton launches (cheap enough for timed calls).
- `snapshot_inputs` / `require_inputs_unchanged` catch a call that modifies its inputs (bench.measure uses them).
What the judge decides from these records lives in `infracourse.grading.verdicts`; this module never imports
the grading package (the worker and the kit load it).
"""
from __future__ import annotations

import functools
import secrets
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from infracourse.failures import LabCheckFailed

# Ops allowed beside a learner's kernel are classified by what they do, from their schema (`op_effect`):
# views, factories (allocations), copies and fills are allowed; anything that computes an answer is not.
# These are the copies and fills whose schemas do not say so (no alias annotation, a Tensor argument).
COPY_OR_FILL_OPS = frozenset({
    "copy_", "_to_copy", "clone", "_copy_from", "_copy_from_and_resize", "lift_fresh", "lift_fresh_copy",
    "fill_", "zero_", "resize_", "set_", "type_as", "_reshape_copy", "_local_scalar_dense", "item",
    "is_same_size", "resolve_conj", "resolve_neg", "record_stream", "_unsafe_view", "empty_permuted",
})


@functools.lru_cache(maxsize=None)
def op_effect(name: str) -> str:
    """'view', 'factory', 'copy' or 'compute' for an aten op name (as the dispatcher or profiler reports it).

    A view is an op whose every overload returns an alias of an input (schema alias annotation); a factory
    takes no tensor, or takes one only for its metadata (`*_like`, `new_*`); copies and fills are listed
    above. Anything else, including names torch does not know, computes.
    """
    import torch

    if name in COPY_OR_FILL_OPS:
        return "copy"
    if name.endswith("_like") or name.startswith("new_"):
        return "factory"
    packet = getattr(torch.ops.aten, name, None) if name.isidentifier() else None
    if packet is None:
        return "compute"
    try:
        schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
    except (AttributeError, RuntimeError):
        return "compute"
    # out= variants write into a given tensor, and some packets hold non-tensor overloads (slice.str): the
    # op's effect is read off the overloads that return tensors and take no out= argument
    schemas = [s for s in schemas if not any(a.is_out for a in s.arguments)
               and any(_is_tensor_type(r.type) for r in s.returns)]
    if not schemas:
        return "compute"
    if all(not any(_is_tensor_type(a.type) for a in s.arguments) for s in schemas):
        return "factory"
    if all(r.alias_info is not None and not r.alias_info.is_write
           for s in schemas for r in s.returns if _is_tensor_type(r.type)):
        return "view"
    if name.endswith("_") and op_effect(name[:-1]) == "view":
        return "view"  # the in-place form of a view (detach_, t_, squeeze_) changes only self's metadata
    return "compute"


def _is_tensor_type(arg_type) -> bool:
    text = str(arg_type)
    return "Tensor" in text


_state = threading.local()
# Records open in any thread: a kernel is attributed to them whichever thread launches it (autograd runs a CUDA
# backward on its own device thread). The ops observers and the context stack stay per thread.
_open_records: list = []


ALLOCATION_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                            "empty_permuted"})
CANARY = -1234.0  # written around every poisoned allocation; a changed canary is an out-of-bounds store
CANARY_ELEMENTS = 4096


# Profiler annotations that mark the grader's own work; a random suffix keeps a learner from naming theirs alike.
_TOKEN = secrets.token_hex(6)
GUARD_MARK = f"infracourse::guard-{_TOKEN}"    # poisoning allocations: not the learner's ops
TUNER_MARK = f"infracourse::tuner-{_TOKEN}"    # Triton's autotuner benchmarking configs: not the learner's ops
KERNEL_MARK = f"infracourse::kernel-{_TOKEN}"  # a Triton kernel running (its body is the learner's code)


@dataclass
class CallRecord:
    ops: list[str] = field(default_factory=list)  # seen by the dispatch mode
    kernels: list[str] = field(default_factory=list)
    allocations: list[tuple[Any, int, int]] = field(default_factory=list)  # (buffer, start, length)
    profiled: list[str] = field(default_factory=list)  # seen by the profiler, on every thread
    oob_writes: int = 0  # counted in the worker, for a record that crossed the channel
    inputs_modified: list[int] = field(default_factory=list)
    kernel_buffers: set = field(default_factory=set)  # storages (data_ptr) passed to launched kernels
    derived: dict = field(default_factory=dict)       # storage -> input positions it holds (views, copies)
    kernel_tensors: list = field(default_factory=list)  # the tensors passed to launched kernels (launch record)
    follow_copies: bool = False  # keep kernel_tensors, for derive_by_value after an unwatched call
    inputs_read: list[int] = field(default_factory=list)   # input positions a kernel was given (data flow)
    output_written: bool | None = None                      # a kernel was given the output's storage

    @classmethod
    def from_evidence(cls, evidence: dict) -> "CallRecord":
        """A record the worker sent: lists of names and counts, type-checked (it is untrusted data)."""
        def names(key):
            values = evidence.get(key, [])
            return [str(v)[:200] for v in values] if isinstance(values, list) else ["<malformed record>"]
        count = evidence.get("oob_writes", 0)
        modified = evidence.get("inputs_modified", [])
        read = evidence.get("inputs_read", [])
        return cls(ops=names("ops"), kernels=names("kernels"), profiled=names("profiled"),
                   oob_writes=count if isinstance(count, int) else 1,
                   inputs_modified=[m for m in modified if isinstance(m, int)] if isinstance(modified, list) else [0],
                   inputs_read=[r for r in read if isinstance(r, int)] if isinstance(read, list) else [],
                   output_written=evidence.get("output_written") is True)

    def trace_data_flow(self, inputs: list, output) -> None:
        """Which inputs reached a kernel (directly, as a view, or through copies made in the call) and whether
        the output's storage was given to a kernel: host work followed by a copy kernel fails both."""
        self.inputs_read = sorted({position for ptr in self.kernel_buffers for position in self.derived.get(ptr, ())})
        outputs = list(output) if isinstance(output, (tuple, list)) else [output]
        storages = _tensor_storages(outputs)
        unwritten = storages - self.kernel_buffers
        for out in outputs:  # a copy of what a kernel wrote (dw accumulated in fp32, returned as .to(bf16)), made
            if _is_tensor(out) and out.numel() and out.untyped_storage().data_ptr() in unwritten and any(
                    t.numel() == out.numel() and t.device == out.device and _holds_values(t, out)
                    for t in self.kernel_tensors):  # where no dispatch record sees it (autograd's CUDA thread)
                unwritten.discard(out.untyped_storage().data_ptr())
        self.output_written = bool(storages) and not unwritten

    def compute_ops(self, allowed: frozenset[str] = frozenset()) -> list[str]:
        """Ops seen by either observer that compute (see `op_effect`), less those `allowed` by the check."""
        seen = set(self.ops) | set(self.profiled)
        return sorted(op for op in seen if op not in allowed and op_effect(op) == "compute")

    def out_of_bounds_writes(self) -> int:
        """Elements changed in the canary zones around the poisoned allocations."""
        changed = self.oob_writes
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



def _context() -> str | None:
    """'kernel' while a Triton kernel runs, 'tuner' while Triton's autotuner benchmarks, else None."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def _mark(name: str):
    """A profiler annotation around the grader's own work (a no-op cost when nothing is watched)."""
    if not getattr(_state, "records", None):
        return nullcontext()
    from torch.profiler import record_function

    return record_function(name)


def _install_triton_hooks() -> None:
    """Count launches of Triton kernels and mark, for the observers, which work is Triton's own.

    Ops inside a kernel are still the learner's (under the interpreter its body is Python that could call
    torch) and are recorded, but not poisoned: the interpreter's own copies must stay intact. The autotuner's
    benchmarking of configurations (`Autotuner._bench`: thousands of timed launches, each after an L2 flush)
    is Triton's: its launches and ops are not recorded, and this thread's dispatch record steps aside while
    it runs. The rest of an autotuned call (the learner's prune and pre-hooks, the launch of the chosen
    configuration) is the learner's, recorded like any other.
    """
    if getattr(_install_triton_hooks, "done", False):
        return
    try:
        from triton.runtime import autotuner, interpreter, jit
    except ImportError:
        return
    hooks = {jit.JITFunction: ("run", "kernel"), interpreter.InterpretedFunction: ("run", "kernel"),
             autotuner.Autotuner: ("_bench", "tuner")}
    for cls, (method, kind) in hooks.items():
        original = getattr(cls, method)

        def run(self, *args, _original=original, _kind=kind, **kwargs):
            records = _open_records
            if not records:  # nothing watched: no bookkeeping at all (timed calls launch through here)
                return _original(self, *args, **kwargs)
            stack = _state.__dict__.setdefault("stack", [])
            if "tuner" in stack:  # a launch of Triton's benchmarking: not the learner's call
                return _original(self, *args, **kwargs)
            if _kind == "kernel" and not kwargs.get("warmup", False):
                values = list(args) + list(kwargs.values())
                buffers = _tensor_storages(values)
                for record in records:
                    record.kernels.append(getattr(self, "__name__", type(self).__name__))
                    record.kernel_buffers.update(buffers)
                    if record.follow_copies:
                        record.kernel_tensors.extend(v for v in values if _is_tensor(v))
            stack.append(_kind)
            try:
                with _mark(KERNEL_MARK if _kind == "kernel" else TUNER_MARK), \
                        (_dispatch_modes_off() if _kind == "tuner" else nullcontext()):
                    return _original(self, *args, **kwargs)
            finally:
                stack.pop()

        setattr(cls, method, run)
    _install_triton_hooks.done = True


def _dispatch_modes_off():
    """This thread's dispatch modes (the watch's record) set aside: the autotuner's benchmarking runs its
    L2 flush thousands of times, each op through the record's Python cost otherwise."""
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:
        return nullcontext()
    return _disable_current_modes()


def _start_profiler():
    """The torch profiler on every thread (the calling thread only on a torch without that option)."""
    from torch.profiler import ProfilerActivity, profile

    attempts = [{}]
    try:
        from torch._C._profiler import _ExperimentalConfig

        attempts.insert(0, {"experimental_config": _ExperimentalConfig(profile_all_threads=True)})
    except (ImportError, TypeError):
        pass
    for options in attempts:
        profiler = profile(activities=[ProfilerActivity.CPU], **options)
        try:
            profiler.__enter__()
            return profiler
        except RuntimeError as exc:
            error = exc
    raise LabCheckFailed(f"could not watch your call ({error}): do not leave a torch profiler running in your "
                         "module while it is graded")


def _stop_profiler(profiler) -> list[str]:
    """Names of the ops the profiler saw, less the grader's own work ('aten::' dropped): an op counts unless the
    innermost grader mark around it (same thread, enclosing interval) is GUARD_MARK or TUNER_MARK.

    Read from Kineto's raw events: building torch's FunctionEvent tree costs ~100 us an event, and Triton's
    autotuner benchmarking a kernel inside a watched call makes tens of thousands of them (the L2 flush
    before each timed run), which took ~1.3 s a configuration on the H200."""
    try:
        profiler.__exit__(None, None, None)
        events = _kineto_events(profiler)
        if events is None:
            return _ops_from_function_events(profiler.events())
    except (RuntimeError, AssertionError) as exc:
        raise LabCheckFailed(f"the profiler that watches your call was disturbed inside it ({exc}): do not "
                             "start, stop or reconfigure torch profilers in your code") from None
    ops, open_marks = [], {}  # thread -> the grader marks enclosing the current event, innermost last
    # by thread and start; at one start a mark before the ops it encloses, the longer mark first
    for thread, start, end, name, annotation in sorted(
            events, key=lambda e: (e[0], e[1], not e[3].startswith("infracourse::"), -e[2])):
        stack = open_marks.setdefault(thread, [])
        while stack and stack[-1][0] <= start:
            stack.pop()  # marks that ended before this event began
        if name.startswith("infracourse::"):
            stack.append((end, name))
            continue
        if annotation or "::" not in name:
            continue
        inner = next((mark for mark_end, mark in reversed(stack) if mark_end >= end), None)
        if inner in (GUARD_MARK, TUNER_MARK):
            continue
        namespace, _, op = name.partition("::")
        if namespace != "profiler":
            ops.append(op if namespace == "aten" else name)
    return ops


def _kineto_events(profiler) -> list[tuple] | None:
    """(thread, start ns, end ns, name, is a user annotation) of every event; None where this torch's profiler
    does not expose them so (the FunctionEvent tree is read instead)."""
    results = getattr(getattr(profiler, "profiler", None), "kineto_results", None)
    if results is None:
        return None
    try:
        return [(e.start_thread_id(), e.start_ns(), e.end_ns(), e.name(),
                 getattr(e, "is_user_annotation", lambda: False)()) for e in results.events()]
    except (AttributeError, TypeError):
        return None


def _ops_from_function_events(events) -> list[str]:
    """The same from torch's FunctionEvent tree (a torch whose profiler keeps no Kineto results)."""
    ops = []
    for event in events or []:
        if getattr(event, "is_user_annotation", False) or "::" not in event.name:
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("infracourse::"):
            parent = parent.cpu_parent
        if parent is not None and parent.name in (GUARD_MARK, TUNER_MARK):
            continue
        namespace, _, op = event.name.partition("::")
        if namespace != "profiler":
            ops.append(op if namespace == "aten" else event.name)
    return ops


def _is_tensor(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def derive_by_value(record: CallRecord, inputs: list) -> None:
    """Add to `record.derived` what no dispatch record saw (a call watched by launches only, or copies made on
    another thread than the watch's, as autograd's CUDA backward makes them): an input's own storage, and any
    tensor a kernel was given that holds an input's values — the wrapper's .contiguous(), .float() or
    transposed copy. A result computed another way holds no input's values and derives from none."""
    import torch

    for i, a in enumerate(inputs):
        for ptr in _tensor_storages([a]):
            record.derived.setdefault(ptr, set()).add(i)
    for t in record.kernel_tensors:
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is None or ptr in record.derived:
            continue
        for i, a in enumerate(inputs):
            if isinstance(a, torch.Tensor) and a.numel() == t.numel() and a.device == t.device \
                    and _holds_values(t, a):
                record.derived.setdefault(ptr, set()).add(i)


def _holds_values(copy, source) -> bool:
    """`copy` holds `source`'s values: same shape, transposed, or flattened; in source's dtype after a cast."""
    import torch

    with torch.no_grad():
        cast = copy.detach().to(source.dtype)
        candidates = [source] + ([source.mT] if source.dim() >= 2 else [])
        return any(cast.shape == c.shape and torch.equal(cast, c) for c in candidates) or \
            torch.equal(cast.reshape(-1), source.detach().reshape(-1))


def _tensor_storages(values: list) -> set:
    import torch

    return {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor) and v.numel()}


@contextmanager
def watch_call(poison: bool = True, inputs: tuple = (), follow_copies: bool = False):
    """Record aten ops and Triton launches made inside the block: `with watch_call() as rec: f(x)`.

    With `poison`, floating-point tensors allocated inside the block start as NaN (an element the kernel
    never writes stays NaN) and are fenced by canaries (a store past the end changes one). `rec.profiled` is
    filled when the block ends. Watches do not nest (one profiler at a time). With `follow_copies` the
    tensors given to kernels are kept, for `derive_by_value`.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    _install_triton_hooks()
    record = CallRecord(follow_copies=follow_copies)
    for position, value in enumerate(inputs):  # data flow starts at the inputs' storages
        for ptr in _tensor_storages([value]):
            record.derived.setdefault(ptr, set()).add(position)

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            context = _context()
            if context == "tuner" or func.namespace == "profiler":
                return out  # Triton's benchmarking, or the profiler's own bookkeeping
            name = func._overloadpacket.__name__
            record.ops.append(name)
            if op_effect(name) in ("view", "copy"):  # a copy of an input still carries that input
                sources = set().union(*(record.derived.get(p, set()) for p in
                                        _tensor_storages(list(args) + list((kwargs or {}).values()))))
                if sources:
                    outs = list(out) if isinstance(out, (tuple, list)) else [out]
                    for ptr in _tensor_storages(outs):
                        record.derived.setdefault(ptr, set()).update(sources)
            if context is None and poison and name in ALLOCATION_OPS and out.is_floating_point() and out.numel():
                with _mark(GUARD_MARK):
                    out, fence = poisoned_allocation(out)
                record.allocations.append(fence)
            return out

    profiler = _start_profiler()
    try:
        with _open(record), _Recorder():
            yield record
    finally:
        record.profiled = _stop_profiler(profiler)


@contextmanager
def record_launches():
    """Only the Triton launches (kernel names and the storages passed to them) made inside the block: cheap
    enough for timed calls, where a dispatch mode or profiler would change the time."""
    record = CallRecord(follow_copies=True)
    _install_triton_hooks()
    with _open(record):
        yield record


@contextmanager
def _open(record: CallRecord):
    """`record` sees the kernels launched from here on, on any thread, and this thread's grader marks."""
    global _open_records
    _state.records = getattr(_state, "records", []) + [record]
    _open_records = _open_records + [record]  # replaced, never mutated: a launching thread iterates a snapshot
    try:
        yield record
    finally:
        _state.records = [r for r in _state.records if r is not record]
        _open_records = [r for r in _open_records if r is not record]


def snapshot_inputs(args: tuple) -> list:
    """Private copies of the tensor arguments, taken before a learner's call."""
    import torch

    return [a.detach().clone() if isinstance(a, torch.Tensor) else None for a in args]


def same_bits(a, b) -> bool:
    """Equal bit for bit (NaN inputs compare equal to themselves)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(*(t.detach().reshape(-1).contiguous().view(torch.uint8) for t in (a, b)))


def require_inputs_unchanged(args: tuple, snapshot: list, what: str = "your function") -> None:
    """Fail when the call changed any tensor argument: a reference computed afterwards would be fooled."""
    for position, (arg, before) in enumerate(zip(args, snapshot)):
        if before is not None and not same_bits(arg, before):
            raise LabCheckFailed(f"{what} modified its input (argument {position}): write the result into a new "
                                 "tensor and leave the inputs as they were")

