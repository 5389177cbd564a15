"""The worker: the only process that imports and calls the learner's code (child side of grading.protocol).

Started by grading.remote inside the sandbox as `python -m infracourse.grading.worker --in R --out W
--learner DIR`. Its `WorkerLoop` answers the judge's requests one at a time on the main thread, each op
(protocol.Op) by its handler in `WorkerLoop.HANDLERS`, each answer a protocol.Reply; a reader thread routes the
judge's answers to callbacks, which the learner's code may call from any thread. Everything it reports is
evidence for the judge to check, never a verdict: learner code runs here and could change any of it.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from infracourse import bench
from infracourse.grading import protocol
from infracourse.grading.inputs import salted
from infracourse.grading.protocol import Decoder, Encoder, Op, ProtocolError, Reply
from infracourse.observe import derive_by_value, record_launches, same_bits, snapshot_inputs, watch_call

MAX_BATCH = 64


class WorkerLoop:
    """The worker process's side of the channel: the learner's objects it holds (by handle) and the requests
    it serves."""

    def __init__(self, fd_in: int, fd_out: int, learner_dir: Path):
        self.fd_in, self.fd_out = fd_in, fd_out
        self.learner_dir = learner_dir.resolve()
        self.objects: dict[int, Any] = {}
        self.ids = itertools.count(1)
        self.requests: queue.Queue = queue.Queue()
        self.answers: dict[int, queue.Queue] = {}
        self.send_lock = threading.Lock()
        self.callback_ids = itertools.count(1)
        self.batch: dict = {}

    # ------------------------------------------------------------------ transport
    def send(self, header: dict, values: dict, aliases: dict | None = None) -> None:
        encoder = Encoder(on_object=self._handle_for, aliases=aliases or {})
        header, blobs = protocol.encode_message(header, values, encoder)
        with self.send_lock:
            protocol.send(self.fd_out, header, blobs)

    def read_loop(self) -> None:
        """Reader thread: requests to the main thread, callback answers to their waiting caller."""
        try:
            while True:
                header, blobs = protocol.receive(self.fd_in)
                if "cid" in header:
                    waiting = self.answers.pop(header["cid"], None)
                    if waiting is not None:
                        waiting.put((header, blobs))
                else:
                    self.requests.put((header, blobs))
        except (EOFError, OSError, ProtocolError):
            self.requests.put(None)  # the judge is gone: stop

    def decoder(self, header: dict, blobs: list) -> Decoder:
        return Decoder(blobs, header.get("storages", []), on_callback=self._callback, on_object=self._build,
                       on_handle=lambda node: self.objects[node["handle"]])

    def _handle_for(self, value: Any) -> dict:
        key = next(self.ids)
        self.objects[key] = value
        return {"handle": key, "type": type(value).__name__, "callable": callable(value)}

    def _build(self, spec: dict) -> Any:
        target = spec["target"]
        module_name, _, name = target.partition(":")
        if not module_name.startswith("infracourse.") or not name:
            raise ProtocolError(f"worker objects come from the course package only, not {target!r}")
        factory = getattr(importlib.import_module(module_name), name)
        return factory(*spec["args"], **spec["kwargs"])

    def _callback(self, cid: int):
        """A stand-in for one of the judge's callables: calling it runs the original in the judge."""
        def call_judge(*args, **kwargs):
            key = next(self.callback_ids)
            waiting: queue.Queue = queue.Queue()
            self.answers[key] = waiting
            self.send({"callback": cid, "cid": key}, {"args": args, "kwargs": kwargs})
            header, blobs = waiting.get()
            value = self.decoder(header, blobs).decode(header.get("value"))
            if not header.get("ok"):
                raise RuntimeError(f"the grader's function raised: {value}")
            return value
        return call_judge

    # ------------------------------------------------------------------ requests
    def serve(self) -> None:
        threading.Thread(target=self.read_loop, daemon=True).start()
        while True:
            item = self.requests.get()
            if item is None:
                return
            header, blobs = item
            try:
                reply = self.handle(header, self.decoder(header, blobs))
                self.send({"id": header.get("id"), "ok": True, "graph": reply.graph},
                          {"value": reply.value, "record": reply.record}, reply.aliases)
            except BaseException as exc:  # anything the learner's code raises is reported, never fatal here
                if isinstance(exc, (KeyboardInterrupt, SystemExit)) and not isinstance(exc, SystemExit):
                    raise
                self.send({"id": header.get("id"), "ok": False, "error": self.describe(exc)}, {})

    def handle(self, header: dict, decoder: Decoder) -> Reply:
        """Free the handles the judge released, then answer the request by its op's handler."""
        try:
            op = Op(header.get("op"))
        except ValueError:
            raise ProtocolError(f"unknown op {header.get('op')!r}") from None
        for key in header.get("release", []):
            self.objects.pop(key, None)
        return self.HANDLERS[op](self, header, decoder)

    # ------------------------------------------------------------------ handlers (one per protocol.Op)
    def ping(self, header: dict, decoder: Decoder) -> Reply:
        return Reply()

    def import_(self, header: dict, decoder: Decoder) -> Reply:
        return Reply(self.import_module(str(header["module"])))

    def getattr_(self, header: dict, decoder: Decoder) -> Reply:
        return Reply(getattr(self.objects[header["target"]], str(header["name"])))

    def release(self, header: dict, decoder: Decoder) -> Reply:
        for key in header.get("handles", []):
            self.objects.pop(key, None)
        return Reply()

    def build(self, header: dict, decoder: Decoder) -> Reply:
        """A course object (a probe around learner code), built here: its value, or a handle on it."""
        return Reply(decoder.decode(header.get("object")))

    def import_module(self, name: str):
        path = self.learner_dir / f"{name}.py"
        if not path.exists():
            raise LearnerImportError(f"{path.name} is missing from your week folder: restore it with "
                                     "`infracourse reset` or create it")
        try:
            return importlib.import_module(name)
        except Exception as exc:  # any failure at import time is the learner's to fix
            raise LearnerImportError(self._import_failure(exc, path)) from None

    def _import_failure(self, exc: Exception, path: Path) -> str:
        """Which of the learner's files failed and where: the file holding a syntax error, or the innermost of
        their files the exception passed through, never just the module the grader imported."""
        if isinstance(exc, SyntaxError):
            culprit, detail = Path(exc.filename or path).name, f"SyntaxError: {exc.msg} (line {exc.lineno})"
        else:
            own = [f for f in traceback.extract_tb(exc.__traceback__)
                   if Path(f.filename).resolve().is_relative_to(self.learner_dir)]
            culprit = Path(own[-1].filename).name if own else path.name
            detail = f"{type(exc).__name__}: {exc}" + (f", line {own[-1].lineno}" if own else "")
        where = path.name if culprit == path.name else f"{culprit}, which {path.name} imports,"
        return f"{where} does not import ({detail}); fix it and grade again"

    def call(self, header: dict, decoder: Decoder) -> Reply:
        import torch

        fn = self.objects[header["target"]]
        args = decoder.decode(header.get("args", {"tuple": []}))
        kwargs = decoder.decode(header.get("kwargs", {"dict": {}}))
        aliases = {(str(s.device), s.data_ptr()): i for i, s in enumerate(decoder._built.values())}
        watch = header.get("watch")
        record: dict = {}
        if watch is not None:
            flat = list(args) + list(kwargs.values())
            before = snapshot_inputs(tuple(flat))
            with watch_call(poison=bool(watch.get("poison", True)), inputs=tuple(flat)) as rec:
                out = fn(*args, **kwargs)
            rec.trace_data_flow(flat, out)
            record = {"ops": rec.ops, "kernels": rec.kernels, "profiled": rec.profiled,
                      "oob_writes": rec.out_of_bounds_writes(), "inputs_read": rec.inputs_read,
                      "output_written": rec.output_written,
                      "inputs_modified": [i for i, (a, b) in enumerate(zip(flat, before))
                                          if b is not None and not _same(a, b)]}
        else:
            out = fn(*args, **kwargs)
        leaves = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a.requires_grad]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        grad_outs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        graph = self._handle_for((leaves, grad_outs))["handle"] if leaves and grad_outs else None
        return Reply(out, record, graph, aliases)

    def backward(self, header: dict, decoder: Decoder) -> Reply:
        import torch

        leaves, outs = self.objects[header["graph"]]
        grads = decoder.decode(header.get("grads"))
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
        result = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True,
                                     retain_graph=True)  # gradcheck asks for several vector-Jacobian products
        return Reply(list(result))

    # ------------------------------------------------------------------ timing
    def time_prepare(self, header: dict, decoder: Decoder) -> Reply:
        """Event-timed samples through bench.measure, then a watched pass over inputs like the clocked batch's.

        The clocked batch's own inputs do not exist yet: time_run draws them from the salt the judge sends with
        it, inside the judge's clock, so no output can be computed before that clock starts."""
        import torch

        fn = self.objects[header["target"]]
        make_args = decoder.decode(header["make_args"])
        sample_index = itertools.count(10**6)  # sample calls use inputs the judge does not regenerate
        timing = bench.measure(fn, make_args=lambda: make_args(next(sample_index)), wall_clock=False,
                               **decoder.decode(header.get("options", {"dict": {}})))
        on_gpu = torch.cuda.is_available()
        calls = max(2, min(int(header.get("calls", 16)), MAX_BATCH))
        first = make_args(0)
        if on_gpu:
            size = sum(a.nbytes for a in first if isinstance(a, torch.Tensor)) or 1
            calls = max(2, min(calls, int(0.2 * torch.cuda.mem_get_info()[0] // (2 * size))))
        batch = [first] + [make_args(i) for i in range(1, calls)]
        host_s = 0.0
        if on_gpu:  # the host's time to enqueue one call as time_run makes it, its inputs' draw included (its
            torch.cuda.synchronize()  # launches recorded): the judge holds the device that long per call, so
            spans = []                # the clocked batch never starves
            for index in range(5):
                t0 = time.perf_counter()
                args = make_args(index)
                with record_launches():
                    fn(*args)
                spans.append(time.perf_counter() - t0)
            host_s = sorted(spans)[len(spans) // 2]  # the median: the first call of a batch can be the slowest
            torch.cuda.synchronize()
            # no more calls than the judge will clock (its rule, bench.clocked_batch): a watched call (dispatch
            # mode and profiler) of a training step is slow, and a hold covers only a few steps, not 48
            calls = bench.clocked_batch(calls, host_s)[0]
            batch = batch[:calls]
        observed = []
        for args in batch:  # untimed pass, every call watched: the allocator also settles before the clock runs
            with watch_call(poison=False, inputs=args, follow_copies=True) as rec:
                out = fn(*args)
            derive_by_value(rec, list(args))  # copies the dispatch record missed (made on autograd's thread)
            rec.trace_data_flow(list(args), out)
            rec.kernel_tensors.clear()
            observed.append(rec)
        flow_broken = sum(_flow_broken(r, args) for r, args in zip(observed, batch))
        del batch, out, args
        self.batch = {"fn": fn, "make_args": make_args, "calls": calls}
        gc.collect()  # here, not inside the judge's clock: time_run pauses collections (bench.gc_paused)
        return Reply({"median_s": timing.median_s, "p10_s": timing.p10_s, "p90_s": timing.p90_s,
                      "n": len(timing.samples_s), "calls": calls, "host_s": host_s},
                     {"ops": sorted({op for r in observed for op in r.ops}),
                      "profiled": sorted({op for r in observed for op in r.profiled}),
                      "kernels": sorted({k for r in observed for k in r.kernels}),
                      "calls_without_kernel": sum(not r.kernels for r in observed),
                      "calls_without_data_flow": flow_broken})

    def time_run(self, header: dict, decoder: Decoder) -> Reply:
        """Draw the batch's inputs from the judge's salt and run the calls back to back (the device held first,
        so the draws and the launches queue), then synchronise. The draws run inside the judge's clock, which
        takes off their cost as the judge measured it itself (grading.perf)."""
        import torch

        calls = max(2, min(int(header.get("calls", self.batch["calls"])), self.batch["calls"]))
        fn, make_args, salt = self.batch["fn"], self.batch["make_args"], int(header["salt"])
        on_gpu = torch.cuda.is_available()
        for stale in ("args", "outputs", "launches"):  # a second clocked batch (a longer hold) replaces the first
            self.batch.pop(stale, None)
        outputs, launches = [], []
        with bench.gc_paused():
            held = bench.hold_device(float(header.get("hold_s", 0.0))) if on_gpu else bench.DeviceHold()
            t0 = time.perf_counter()
            batch = [make_args(salted(salt, i)) for i in range(calls)]
            for args in batch:
                with record_launches() as rec:  # launches only: anything heavier would change the time
                    outputs.append(fn(*args))
                launches.append(rec)
            enqueued = time.perf_counter() - t0
            if on_gpu:
                torch.cuda.synchronize()
        # the judge's clock stops when this reply arrives: the launch records are read in time_outputs
        self.batch.update(args=batch, outputs=outputs, launches=launches)
        return Reply({"hold_s": held.seconds(), "calls": len(batch), "enqueue_s": enqueued})

    def time_idle(self, header: dict, decoder: Decoder) -> Reply:
        """A clocked batch of no calls: the hold and the synchronise alone, so the judge can measure what its
        clock of a batch costs besides the calls (the channel, waking each side, the hold's launch)."""
        import torch

        on_gpu = torch.cuda.is_available()
        with bench.gc_paused():
            held = bench.hold_device(float(header.get("hold_s", 0.0))) if on_gpu else bench.DeviceHold()
            if on_gpu:
                torch.cuda.synchronize()
        return Reply({"hold_s": held.seconds()})

    def time_outputs(self, header: dict, decoder: Decoder) -> Reply:
        """The outputs the judge picked, and what the clocked batch's launches read and wrote."""
        batch, self.batch = self.batch, {}
        broken = 0
        for rec, args, out in zip(batch["launches"], batch["args"], batch["outputs"]):
            derive_by_value(rec, list(args))  # copies the wrapper made count as the inputs they hold
            rec.trace_data_flow(list(args), out)
            broken += _flow_broken(rec, args)
        return Reply([batch["outputs"][i] for i in header["indices"]],
                     {"calls_without_kernel": sum(not r.kernels for r in batch["launches"]),
                      "calls_without_data_flow": broken})

    # ------------------------------------------------------------------ errors
    def describe(self, exc: BaseException) -> dict:
        where = ""
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            path = Path(frame.filename)
            if path.parent.resolve() == self.learner_dir:
                where = f"{path.name}:{frame.lineno}: {frame.line}"
                break
        return {"type": type(exc).__name__, "message": str(exc)[:2000], "where": where}

    HANDLERS: dict[Op, Callable[["WorkerLoop", dict, Decoder], Reply]] = {
        Op.PING: ping, Op.IMPORT: import_, Op.GETATTR: getattr_, Op.RELEASE: release, Op.CALL: call,
        Op.BUILD: build, Op.BACKWARD: backward, Op.TIME_PREPARE: time_prepare, Op.TIME_RUN: time_run,
        Op.TIME_IDLE: time_idle, Op.TIME_OUTPUTS: time_outputs}


def _flow_broken(record, args) -> bool:
    """An input never given to a kernel, or an output no kernel was given (see grading.verdicts.require_data_flow)."""
    import torch

    unread = any(isinstance(a, torch.Tensor) and a.numel() and i not in record.inputs_read for i, a in enumerate(args))
    return bool(unread or record.output_written is False)


class LearnerImportError(Exception):
    """The learner's file does not import."""


def _same(a, b) -> bool:
    return same_bits(a, b)


def main(argv: list[str] | None = None) -> None:
    __import__("faulthandler").enable()  # a segfault in learner code prints its Python stack into the worker log
    parser = argparse.ArgumentParser(prog="infracourse.grading.worker")
    parser.add_argument("--in", dest="fd_in", type=int, required=True)
    parser.add_argument("--out", dest="fd_out", type=int, required=True)
    parser.add_argument("--learner", type=Path, required=True)
    options = parser.parse_args(argv)
    try:  # before the learner's folder is on the path: start-up time is not charged to a check (remote.ready)
        import torch  # noqa: F401
    except ImportError:
        pass
    # the learner's folder replaces the start folder (the scratch dir) at the head of the import path
    sys.path[:] = [str(options.learner.resolve())] + [p for p in sys.path[1:] if p not in ("", os.getcwd())]
    sys.dont_write_bytecode = True
    if os.environ.get("TRITON_INTERPRET") == "1":
        from infracourse.kit.triton_compat import patch_interpreter_scalars  # why: imports triton, for kernel labs only

        patch_interpreter_scalars()  # before any learner kernel runs in the interpreter
    WorkerLoop(options.fd_in, options.fd_out, options.learner).serve()


if __name__ == "__main__":
    main()
