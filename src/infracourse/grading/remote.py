"""Judge side of the worker channel: the learner's code as proxies the graders call like local code.

`Learner.module("vector_ops")` gives a `RemoteObject`; `ops.add(x, y)` sends x and y to the worker, which calls
the learner's function and sends the output back as plain data. Callables the judge passes (a workload,
a sync function) stay in the judge and run there when the worker calls them. Tensors that require grad
bridge autograd: the backward pass runs in the worker on the graph its forward pass built.

Whatever the worker sends is untrusted: it is decoded by grading.protocol (no pickle), size-limited, and
a worker that dies, hangs up or breaks the protocol makes the call raise `WorkerFailed` with what happened.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from infracourse import launch
from infracourse.grading import protocol
from infracourse.grading.protocol import (COMPILE_CACHE_ENV, BuildInWorker, Decoder, Encoder, Foreign, Handle, Op,
                                         ProtocolError)
from infracourse.grading.provenance import require_clean_sources
from infracourse.launch import output

__all__ = ["BuildInWorker", "Foreign", "LearnerRaised", "RemoteObject", "WorkerClient", "WorkerFailed"]

class WorkerFailed(Exception):
    """The worker died, hung up, or broke the protocol: the check that was running is an `error`."""


class LearnerHung(Exception):
    """A learner function that overran a check's time limit earlier in this grade: not called again, so a
    function that never returns costs one time limit, not one per check."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"{name}() did not return within an earlier check's time limit in this grade, so it was "
                         "not called again: look for an infinite loop, a wait that never ends, or a deadlock")


class LearnerRaised(Exception):
    """The learner's code raised inside the worker. `type_name`, `where` ('file.py:LINE: code') say what."""

    def __init__(self, type_name: str, message: str, where: str = ""):
        self.type_name, self.message, self.where = type_name, message, where
        at = f" (at {where})" if where else ""
        super().__init__(f"{type_name}: {message}{at}")


@dataclass
class CallResult:
    value: Any
    record: dict = field(default_factory=dict)   # what the worker observed during a watched call (evidence)
    graph: int | None = None                      # the worker's autograd graph of this call, if any


class WorkerClient:
    """The judge's side of one sandboxed worker process for one grading session (started on first use): it
    lives in the judge and sends the worker its requests (protocol.Op)."""

    def __init__(self, learner_dir: Path, *, gpu: bool, scratch: Path | None = None):
        self.learner_dir = learner_dir.resolve()
        self.gpu = gpu
        self._scratch_owner = None if scratch else tempfile.TemporaryDirectory(prefix="infracourse-worker-")
        self.scratch = Path(scratch or self._scratch_owner.name).resolve()
        self.sandboxed = launch.confining()
        self.proc: launch.Launched | None = None
        self.generation = 0  # one per worker process: a handle or graph of a dead process names nothing in the next
        self.ids = itertools.count(1)
        self.lock = threading.RLock()
        self.hung: set[str] = set()          # functions that overran a limit earlier in this grade
        self.on_call: Callable[..., None] | None = None  # told (name, inputs, elements) of each learner call
        self.callbacks: dict[int, Callable] = {}
        self.released: list[tuple[int, int]] = []  # (generation, id) the judge dropped: freed with the next request
        self.callback_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="infracourse-callback")
        self.log_path = self.scratch.parent / f"{self.scratch.name}.log"
        self.native_code = False  # the lab hands out C to load with ctypes (grading.provenance.native_code_allowed)
        self.output: output.Capture | None = None  # the current process's stdout and stderr

    # ------------------------------------------------------------------ process
    def start(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                return
            self._discard()  # it died during an earlier check (which is an error): a fresh one for this one
        self.generation += 1
        self.released = []
        to_worker, self.fd_out = os.pipe()
        self.fd_in, from_worker = os.pipe()
        command = [sys.executable, "-s", "-m", "infracourse.grading.worker", "--in", str(to_worker),
                   "--out", str(from_worker), "--learner", str(self.learner_dir)]
        cache = compile_cache()
        inside = self.scratch / ".triton"  # a kept cache is bound there in the sandbox
        env = launch.environment(self.scratch,
                                 TRITON_CACHE_DIR=str(inside if self.sandboxed or cache is None else cache))
        if self.sandboxed and cache is not None:
            inside.mkdir(exist_ok=True)  # the mount point, in the worker's own scratch
        # its output cut past output.OUTPUT_LIMIT, the worker killed
        self.proc = launch.start(command, scratch=self.scratch, snapshot=self.learner_dir, env=env, gpu=self.gpu,
                                 writable=((cache, inside),) if cache and self.sandboxed else (),
                                 log=self.log_path, pass_fds=(to_worker, from_worker))
        self.output = self.proc.capture
        os.close(to_worker)
        os.close(from_worker)

    def before_call(self, name: str, args: tuple = ()) -> None:
        """Refuse a function that hung earlier in this grade; tell the runner which function is being called
        and on what (so that, if this call hangs, the next judge process knows not to call it again, and the
        message names the input; under the Triton interpreter the runner's limit grows with the input)."""
        if name in self.hung:
            raise LearnerHung(name)
        if self.on_call is not None:
            self.on_call(name, *_describe(args))

    def ready(self) -> None:
        """Start a fresh worker if the last one died and wait until it answers, so that its start-up (importing
        torch) is not charged to the next check's time limit."""
        self.request(Op.PING)

    def close(self) -> None:
        """Stop the worker and everything it started (the sandbox's PID namespace dies with its init)."""
        self._discard()
        self.callback_pool.shutdown(wait=False, cancel_futures=True)
        if self._scratch_owner is not None:
            self._scratch_owner.cleanup()
            self.log_path.unlink(missing_ok=True)  # what it printed was read into the messages: not kept per grade

    def _discard(self) -> None:
        if self.proc is not None:
            for fd in (self.fd_out, self.fd_in):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.proc.kill_tree()
            self.proc.wait()
            self.proc = None
            self.output.finish()  # its log is whole before a fresh worker's replaces it

    def cpu_seconds(self) -> float | None:
        """CPU seconds the worker's live processes and threads have run so far, read by the judge from the
        kernel's per-thread accounting (/proc/PID/task/TID/schedstat, in ns): a figure the learner's code
        cannot write, and one that other load on a shared CPU does not inflate the way it inflates a wall
        clock. None where the kernel does not provide it (or the worker is gone)."""
        import psutil

        if self.proc is None:
            return None
        total = 0
        try:
            root = psutil.Process(self.proc.pid)
            for process in [root, *root.children(recursive=True)]:
                for tid in os.listdir(f"/proc/{process.pid}/task"):
                    try:
                        with open(f"/proc/{process.pid}/task/{tid}/schedstat") as f:
                            total += int(f.read().split()[0])
                    except FileNotFoundError:
                        continue  # a thread that ended while being read
        except (OSError, ValueError, IndexError, psutil.Error):
            return None
        return total / 1e9

    def clock(self, device: str) -> Callable[[], float]:
        """The clock for timing calls into this worker: on a CPU its CPU seconds (cpu_seconds), which other
        load on a shared machine leaves nearly alone, where the kernel provides them; otherwise, and on a GPU
        (whose time is the work), the judge's wall clock."""
        if device == "cpu" and self.cpu_seconds() is not None:
            return self.cpu_seconds
        return time.perf_counter

    def joint_clock(self, device: str) -> Callable[[], float]:
        """The clock for work split between the judge and this worker (the judge computes a course model, the
        worker the learner's pieces of it): on a CPU the judge's process CPU seconds plus the worker's, where
        the kernel provides them; otherwise, and on a GPU, the judge's wall clock."""
        if device == "cpu" and self.cpu_seconds() is not None:
            return lambda: time.process_time() + (self.cpu_seconds() or 0.0)
        return time.perf_counter

    def output_tail(self, lines: int = 15) -> str:
        if self.output is not None and (self.proc is None or self.proc.poll() is not None):
            self.output.finish()  # it has ended: what it printed before that is in the log
        return output.last_lines(output.read_tail(self.log_path), lines)

    def _death(self) -> str:
        code = self.proc.poll() if self.proc else None
        if code is not None and self.sandboxed and code > 128:
            code = 128 - code  # bwrap, the sandbox's init, exits with 128 + the signal that killed the worker
        if code is None:
            what = "stopped answering"
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
            what = f"was killed by {name}" + (" (segmentation fault)" if name == "SIGSEGV" else "")
        else:
            what = f"exited with code {code}"
        tail = self.output_tail()
        if self.output is not None and self.output.cut:
            what = f"printed too much; {output.CUT_NOTE}"
        return f"the process running your code {what}" + (f"; its last output:\n{tail}" if tail else "")

    # ------------------------------------------------------------------ requests
    def request(self, op: Op | str, values: dict | None = None, *, alias_args: list | None = None,
                generation: int | None = None, **fields) -> Any:
        """Send one request and wait for its answer (a protocol.Reply), serving the worker's callbacks meanwhile.
        `generation`: the worker process the request's handles came from; if that one has died, WorkerFailed."""
        op = Op(op)  # an op the worker does not serve is the judge's bug: ValueError here, before anything is sent
        with self.lock:
            self.start()
            if generation is not None and generation != self.generation:
                raise WorkerFailed(STALE)
            key = next(self.ids)
            encoder = Encoder(on_callable=self._register_callback, handle_of=self._handle_of)
            released = [i for g, i in self.released if g == self.generation]
            self.released = []
            header, blobs = protocol.encode_message({"id": key, "op": op, "release": released, **fields},
                                                    values or {}, encoder)
            try:
                protocol.send(self.fd_out, header, blobs)
                while True:
                    reply, reply_blobs = protocol.receive(self.fd_in)
                    if "callback" in reply:
                        self._serve_callback(reply, reply_blobs)
                        continue
                    if reply.get("id") != key:
                        raise ProtocolError(f"an answer to request {reply.get('id')!r} came while waiting for {key}")
                    break
            except (EOFError, OSError) as exc:
                self._finish_dead()
                raise WorkerFailed(self._death()) from exc
            except Exception as exc:  # ProtocolError, or a callback's arguments the decoder could not rebuild
                self._discard()
                raise WorkerFailed(f"the process running your code broke the grading protocol: {_what(exc)}") from None
            storages = [_storage_of(a) for a in (alias_args or [])]
            decoder = Decoder(reply_blobs, reply.get("storages", []), on_handle=self._wrap_handle,
                              alias_storages=[s for s in storages if s is not None])
            try:
                if not reply.get("ok"):
                    error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
                    raise LearnerRaised(str(error.get("type", "Exception"))[:100], str(error.get("message", ""))[:2000],
                                        str(error.get("where", ""))[:400])
                value = decoder.decode(reply.get("value"))
                record = decoder.decode(reply.get("record")) if "record" in reply else {}
                if not isinstance(record, dict):
                    raise ProtocolError("a call's record is not a mapping")
                graph = reply.get("graph")
            except LearnerRaised:
                raise
            except Exception as exc:  # not only ProtocolError: any value the decoder cannot rebuild is malformed
                self._discard()
                raise WorkerFailed(f"the process running your code sent a malformed answer: {_what(exc)}") from None
            return CallResult(value, record, graph if isinstance(graph, int) else None)

    def _finish_dead(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass

    def _register_callback(self, fn: Callable) -> int:
        key = id(fn)
        self.callbacks[key] = fn
        return key

    def _serve_callback(self, header: dict, blobs: list) -> None:
        """Run one of the judge's callables the worker called; answered from a thread so that concurrent calls
        from the learner's threads overlap (a concurrency test needs that)."""
        fn = self.callbacks.get(header.get("callback"))
        decoder = Decoder(blobs, header.get("storages", []), on_handle=self._wrap_handle)
        args, kwargs = decoder.decode(header.get("args", {"tuple": []})), decoder.decode(header.get("kwargs", {"dict": {}}))

        def run():
            try:
                if fn is None:
                    raise ProtocolError("the worker called a function it was never given")
                value, ok = fn(*args, **kwargs), True
            except Exception as exc:  # the judge's own function failed: tell the caller in the worker
                value, ok = f"{type(exc).__name__}: {exc}", False
            encoder = Encoder(on_callable=self._register_callback, handle_of=self._handle_of)
            out, out_blobs = protocol.encode_message({"cid": header.get("cid"), "ok": ok}, {"value": value}, encoder)
            try:
                protocol.send(self.fd_out, out, out_blobs)
            except OSError:
                pass

        self.callback_pool.submit(run)

    def _handle_of(self, value: Any) -> Handle | None:
        return value._handle if isinstance(value, RemoteObject) and value._worker is self else None

    def _wrap_handle(self, node: dict) -> "RemoteObject":
        return RemoteObject(self, Handle(node["handle"], str(node.get("type", "object"))[:100],
                                         bool(node.get("callable"))))

    def _release(self, generation: int, key: int) -> None:
        self.released.append((generation, key))

    # ------------------------------------------------------------------ learner code
    def module(self, name: str) -> "RemoteObject":
        """The learner's module `name`; if its worker dies, the next use imports it again in a fresh one."""
        module = self.request(Op.IMPORT, module=name).value
        if isinstance(module, RemoteObject):
            object.__setattr__(module, "_origin", ("import", name))
        return module

    def build(self, spec: BuildInWorker) -> Any:
        """Build a course object (`spec.target` in infracourse.*) inside the worker, for code that must run
        there around the learner's (a training step with their norm, a profiler around their call): its value
        when plain data, else a RemoteObject. Learner objects among the top-level args and kwargs (RemoteObjects)
        are passed as themselves, not as callbacks into the judge."""
        def own(value):
            return value._handle if isinstance(value, RemoteObject) and value._worker is self else value

        spec = BuildInWorker(spec.target, tuple(own(a) for a in spec.args),
                             {k: own(v) for k, v in spec.kwargs.items()})
        return self.request(Op.BUILD, {"object": spec}).value


def _describe(args: tuple) -> tuple[str, int]:
    """('float32[1, 1000000], float32[1000000]', elements): the tensor arguments of a call, for the runner."""
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    text = ", ".join(f"{str(t.dtype).removeprefix('torch.')}[{', '.join(map(str, t.shape))}]" for t in tensors)
    return text[:200], sum(t.numel() for t in tensors)


def _what(exc: Exception) -> str:
    return str(exc) if isinstance(exc, ProtocolError) else f"{type(exc).__name__}: {str(exc)[:300]}"


def _storage_of(value):
    import torch

    return value.untyped_storage() if isinstance(value, torch.Tensor) else None


def compile_cache() -> Path | None:
    """The learner's own Triton compile cache, kept between grades (runner.grade's `compile_cache`), or None: a
    fresh one per worker. It holds only what the learner's kernels compiled to, used only by the learner's
    worker, so it can decide nothing the learner's source does not; an instructor's regrade never passes one."""
    value = os.environ.get(COMPILE_CACHE_ENV)
    path = Path(value) if value else None
    return path.resolve() if path is not None and path.is_dir() else None


def origin_of(obj: "RemoteObject") -> tuple[Path, bool, str | None]:
    """What the judge's reading of a learner object's files needs: its worker's snapshot, whether the lab lets it
    load native code, and the 'module.attr.attr' it was reached by from an imported learner module (None for an
    object a course probe built in the worker). A function here, not attributes of the proxy: those would hide
    the learner's own attributes of the same names."""
    worker = obj._worker
    parts, node = [], obj
    while node._origin is not None and node._origin[0] != "import":
        node, attribute = node._origin
        parts.append(attribute)
    path = None if node._origin is None else ".".join([node._origin[1], *reversed(parts)])
    return Path(worker.learner_dir), worker.native_code, path


STALE = ("this object of your code lived in a worker process that has since stopped (an earlier check crashed "
         "or killed it); it cannot be used in the fresh one")


class RemoteObject:
    """A learner object living in the worker: attributes and calls go over the channel.

    A module, and what is reached from it by attribute (its functions and classes), survives the death of its
    worker: the first use afterwards imports it again in the fresh worker, so one crashing check does not
    take the next ones with it. Any other object (what a call returned) dies with its worker: using it
    afterwards raises WorkerFailed."""

    def __init__(self, worker: WorkerClient, handle: Handle, origin: tuple | None = None):
        object.__setattr__(self, "_worker", worker)
        object.__setattr__(self, "_raw", handle)
        object.__setattr__(self, "_generation", worker.generation)
        object.__setattr__(self, "_origin", origin)  # ("import", name) or (parent RemoteObject, attribute)

    @property
    def _handle(self) -> Handle:
        """The handle in the live worker (started here if need be), found again after a worker's death."""
        worker = self._worker
        with worker.lock:
            worker.start()
            if self._generation != worker.generation:
                if self._origin is None:
                    raise WorkerFailed(STALE)
                if self._origin[0] == "import":
                    fresh = worker.request(Op.IMPORT, module=self._origin[1]).value
                else:
                    parent, name = self._origin
                    fresh = worker.request(Op.GETATTR, target=parent._handle.id, name=name).value
                if not isinstance(fresh, RemoteObject):
                    raise WorkerFailed(f"{STALE} (it is no longer an object of your code there)")
                object.__setattr__(self, "_raw", fresh._raw)
                object.__setattr__(self, "_generation", fresh._generation)
            return self._raw

    def _target(self) -> tuple[int, int]:
        handle = self._handle
        return handle.id, self._generation

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_raw", "_generation", "_origin", "_worker"):
            raise AttributeError(name)
        target, generation = self._target()
        value = self._worker.request(Op.GETATTR, target=target, name=name, generation=generation).value
        if isinstance(value, RemoteObject) and self._origin is not None:
            object.__setattr__(value, "_origin", (self, name))  # re-found by name after a worker's death
        return value

    def __call__(self, *args, **kwargs) -> Any:
        return self.call(args, kwargs).value

    def call(self, args: tuple = (), kwargs: dict | None = None, *, watch: dict | None = None) -> CallResult:
        """Call it in the worker; `watch={'poison': True}` also records the ops and kernels it ran. A watched
        call then fails where the learner's files reach the worker's internals: its record could be forged."""
        import torch

        kwargs = kwargs or {}
        self._worker.before_call(self._name(), tuple(args) + tuple(kwargs.values()))
        flat = list(args) + list(kwargs.values())
        needs_grad = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in flat)
        target, generation = self._target()
        result = self._worker.request(Op.CALL, {"args": tuple(args), "kwargs": dict(kwargs)}, target=target,
                                      watch=watch, alias_args=flat, generation=generation)
        if watch is not None:
            require_clean_sources(self._worker.learner_dir, native_code=self._worker.native_code)
        if needs_grad:
            result.value = _bridge_autograd(self._worker, result, flat)
        return result

    def _name(self) -> str:
        """'module.function' as the learner wrote it, for messages and for remembering a hang."""
        if self._origin is None:
            return self._raw.type_name
        if self._origin[0] == "import":
            return self._origin[1]
        parent, attribute = self._origin
        return f"{parent._name()}.{attribute}"

    @property
    def type_name(self) -> str:
        return self._raw.type_name

    def __repr__(self) -> str:
        return f"<learner {self._raw.type_name} in the grading worker>"


def _bridge_autograd(worker: WorkerClient, result: CallResult, inputs: list) -> Any:
    """Make the outputs of a remote call differentiable in the judge: backward runs in the worker."""
    import torch

    value, graph, generation = result.value, result.graph, worker.generation
    if graph is None:
        return value
    leaves = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
    outs = value if isinstance(value, (tuple, list)) else (value,)
    tensors = [o for o in outs if isinstance(o, torch.Tensor)]

    class RemoteBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            return tuple(t.detach().clone() for t in tensors)

        @staticmethod
        def backward(ctx, *grads):
            grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, tensors)]
            got = worker.request(Op.BACKWARD, {"grads": grads}, graph=graph, generation=generation).value
            got = list(got) + [None] * (len(leaves) - len(got))
            return tuple(g if g is None or isinstance(g, torch.Tensor) else None for g in got[:len(leaves)])

    connected = RemoteBackward.apply(*leaves)
    weakref.finalize(connected[0].grad_fn, worker._release, generation, graph)  # freed in the worker once unused
    it = iter(connected)
    rebuilt = [next(it) if isinstance(o, torch.Tensor) else o for o in outs]
    return type(value)(rebuilt) if isinstance(value, (tuple, list)) else rebuilt[0]
