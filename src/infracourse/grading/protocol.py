"""The grading contract: who runs what, and what crosses between them.

Three processes, each trusting only what it may:

  runner (parent)  detects the hardware; decides `blocked`, `requires`, completion and verified-on-GPU; keeps
                   progress. Reads check events from the judge on a pipe inherited as a file descriptor (no
                   path in any argv or environment).
  judge (pytest)   the graders: inputs, references, tolerances, comparisons, verdicts. Never imports or calls
                   learner code; reaches it only through a worker (grading.remote).
  worker           imports the learner's files and calls them (grading.worker), in a sandbox
                   (infracourse.sandbox). Sends back raw outputs and raw measurements only; the judge treats
                   every byte it sends as untrusted data.

Names say the process a thing lives in: in the judge, a `remote.WorkerClient` holds one worker process and
sends it requests (`Op`); in the worker, a `worker.WorkerLoop` serves them; a `BuildInWorker` is a course
object the judge asks the worker to build there. ("Worker" here is always the grading worker process, never a
cohort regrade's parallel grades or a torchrun world's ranks.)

Runner <- judge events, one JSON object per line:
  {"event": "start",  "check": ID}
  {"event": "calling", "check": ID, "target": "module.function", "inputs": "float32[3, 129]", "elements": int}
                   (a learner call begins: if the check then overruns, the runner remembers it as hung; under the
                   Triton interpreter each call gets its own limit, grown with its input: runner.call_limit)
  {"event": "result", "check": ID, "status": S, "message": str, "figures": {name: Figure}, "duration": s}

Runner -> judge, files in the runner's private temporary folder, named by command-line options (plugin):
  lab.json         the week's lab.yaml as the runner parsed it (syllabus.Lab)
  settled.json     {ID: {"status": S, "figures": {name: Figure}}}: the checks this grade settled before this judge
                   process started (blocked here, or settled by an earlier judge process of the grade, which a hang
                   or a crash ended). Not run again; their statuses count for `requires` and their figures are
                   what the report check compares (write_settled / read_settled)

Judge <-> worker messages (framed below, both directions):
  judge -> worker  {"id": n, "op": OP, "release": [handle, ...], ...}   OP an `Op`, its fields listed there;
                   `release`: handles the judge dropped, freed before the request runs
  worker -> judge  {"id": n, "ok": true, "value": V, "record": {...}, "graph": g | null}   (every op: `Reply`)
                   {"id": n, "ok": false, "error": {"type", "message", "where"}}
                   {"callback": c, "cid": k, "args": V, "kwargs": V}   (worker asks the judge to run one of the
                                                                         judge's callables it was given)
  judge -> worker  {"cid": k, "ok": ..., "value": V}                    (the callback's answer)

Values (V) are JSON trees with tagged nodes for what JSON lacks; tensors travel as whole storages plus view
metadata, so strides, offsets, fences and aliasing survive the trip. Nothing is ever unpickled: a worker
message can only produce the types listed in `decode`.
"""
from __future__ import annotations

import enum
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Callable

COMPILE_CACHE_ENV = "INFRACOURSE_COMPILE_CACHE"  # the learner's Triton cache kept between grades (runner)
FATAL_EXIT = 87  # a judge exiting with this code says "the device is unusable here; go on in a fresh process"
MAX_MESSAGE_BYTES = 2 * 2**30       # a larger message from a worker is refused, not read
MAX_HEADER_BYTES = 64 * 2**20
MAX_DEPTH = 64
EVENT_KINDS = ("start", "calling", "result")
STATUSES = ("passed", "failed", "error", "blocked")
_HEADER = struct.Struct("<II")  # header length, blob count


class Op(enum.StrEnum):
    """A judge -> worker request: the op, the fields it carries besides id/op/release, and its reply's value.
    The worker answers every op with one `Reply` (grading.worker's handler table: one handler per op)."""
    PING = "ping"                  # {} -> None: the worker is up (remote.ready)
    IMPORT = "import"              # {module} -> a Handle on the learner's module
    GETATTR = "getattr"            # {target: handle, name} -> the attribute (plain data or a Handle)
    RELEASE = "release"            # {handles} -> None
    CALL = "call"                  # {target, args, kwargs, watch?} -> the output; record: the watched call's
                                   # evidence; graph: its autograd graph when inputs and outputs need grad
    BUILD = "build"                # {object: BuildInWorker} -> the course object's value, or a Handle
    BACKWARD = "backward"          # {graph, grads} -> the inputs' gradients (one vector-Jacobian product)
    TIME_PREPARE = "time_prepare"  # {target, make_args, options, calls} -> event-timed samples; record: a
                                   # watched pass (grading.perf)
    TIME_RUN = "time_run"          # {salt, calls, hold_s} -> the clocked batch's hold, calls and enqueue time
    TIME_IDLE = "time_idle"        # {hold_s} -> the hold of a batch of no calls
    TIME_OUTPUTS = "time_outputs"  # {indices} -> the picked outputs of the clocked batch; record: its launches


@dataclass
class Reply:
    """The worker's answer to any op: `value` (V), `record` (evidence, {} when none) and `graph` (an autograd
    graph kept in the worker for Op.BACKWARD, else None). `aliases`: (device, data_ptr) -> index of the
    request's argument storage, so a reply's tensor that is an argument's storage travels as that alias."""
    value: Any = None
    record: dict = field(default_factory=dict)
    graph: int | None = None
    aliases: dict = field(default_factory=dict)


class ProtocolError(Exception):
    """A message broke the contract (malformed, oversized, unknown type): the sender is not trusted further."""


# ---------------------------------------------------------------------------------------------- framing
def send(fd: int, header: dict, blobs: list[bytes | memoryview] = ()) -> None:
    body = json.dumps(header, allow_nan=True).encode()
    sizes = struct.pack(f"<{len(blobs)}Q", *(len(b) for b in blobs))
    _write_all(fd, _HEADER.pack(len(body), len(blobs)) + sizes + body)
    for blob in blobs:
        _write_all(fd, blob)


def receive(fd: int, limit: int = MAX_MESSAGE_BYTES) -> tuple[dict, list[bytes]]:
    """One message; EOFError when the sender is gone, ProtocolError when it broke the contract."""
    head = _read_exact(fd, _HEADER.size)
    length, count = _HEADER.unpack(head)
    if length > MAX_HEADER_BYTES or count > 4096:
        raise ProtocolError(f"a message announced a {length}-byte header and {count} blobs (limits "
                            f"{MAX_HEADER_BYTES} and 4096)")
    sizes = struct.unpack(f"<{count}Q", _read_exact(fd, 8 * count))
    if length + sum(sizes) > limit:
        raise ProtocolError(f"a message of {length + sum(sizes)} bytes was announced; the limit is {limit}")
    try:
        header = json.loads(_read_exact(fd, length))
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"a message header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ProtocolError("a message header is not a JSON object")
    return header, [_read_exact(fd, n) for n in sizes]


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------------------------------- values
@dataclass
class Handle:
    """An object that stays in the worker (a learner's module, function or returned object)."""
    id: int
    type_name: str
    callable: bool


@dataclass
class Foreign:
    """A worker value the judge does not rebuild (a tensor subclass, a lazy wrapper): named, never trusted."""
    type_name: str


@dataclass
class BuildInWorker:
    """A course object to build inside the worker process, around the learner's code there: `target` is
    'infracourse.<module>:<name>', called with args and kwargs in the worker; the judge gets its value when plain
    data, else a Handle."""
    target: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Encoder:
    """Turns a value into a JSON tree plus blobs. Storages are sent once per message, so views keep sharing."""
    blobs: list = field(default_factory=list)
    storages: dict = field(default_factory=dict)   # (device, data_ptr) -> index in `storage_list`
    storage_list: list = field(default_factory=list)
    on_callable: Callable[[Any], Any] | None = None   # judge: a callable becomes a callback id
    on_object: Callable[[Any], Any] | None = None     # worker: anything else becomes a handle
    aliases: dict = field(default_factory=dict)       # (device, data_ptr) -> arg storage index (worker replies)
    handle_of: Callable[[Any], Handle | None] | None = None  # judge: a proxy of a worker object goes back as it

    def encode(self, value: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ProtocolError("a value is nested too deeply to send")
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return value if abs(value) < 2**62 else {"big": str(value)}
        if isinstance(value, float):
            return value
        if isinstance(value, (list, tuple)):
            items = [self.encode(v, depth + 1) for v in value]
            return items if isinstance(value, list) and type(value) is list else {"tuple": items}
        if isinstance(value, dict) and type(value) is dict and all(isinstance(k, str) for k in value):
            return {"dict": {k: self.encode(v, depth + 1) for k, v in value.items()}}
        if isinstance(value, BuildInWorker):
            return {"object": value.target, "args": self.encode(tuple(value.args), depth + 1),
                    "kwargs": self.encode(dict(value.kwargs), depth + 1)}
        if isinstance(value, Handle):
            return {"handle": value.id}
        if isinstance(value, PurePath):
            return {"path": str(value)}
        encoded = self._encode_array(value)
        if encoded is not None:
            return encoded
        handle = self.handle_of(value) if self.handle_of is not None else None
        if handle is not None:  # a learner object handed back to the worker is that object, not a callback
            return {"handle": handle.id}
        if callable(value) and self.on_callable is not None:
            return {"callback": self.on_callable(value)}
        if self.on_object is not None:
            return self.on_object(value)
        raise ProtocolError(f"a {type(value).__name__} cannot be sent to the worker")

    def _encode_array(self, value: Any) -> Any:
        import sys

        torch = sys.modules.get("torch")
        if torch is not None:
            if isinstance(value, torch.dtype):
                return {"dtype": str(value).removeprefix("torch.")}
            if isinstance(value, torch.device):
                return {"device": str(value)}
            if isinstance(value, torch.Size):
                return {"tuple": [int(v) for v in value]}
            if isinstance(value, torch.Tensor):
                if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
                    return {"foreign": type(value).__name__}
                if value.layout != torch.strided or value.is_nested or value.is_meta:
                    return {"foreign": f"{value.layout} tensor"}
                return {"tensor": self._tensor(value)}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if isinstance(value, numpy.ndarray):
                if value.dtype.kind not in "biuf" or value.dtype.byteorder == ">":
                    return {"foreign": f"numpy array of {value.dtype}"}
                data = numpy.ascontiguousarray(value)
                self.blobs.append(data.tobytes())
                return {"ndarray": {"dtype": data.dtype.str, "shape": list(data.shape), "blob": len(self.blobs) - 1}}
            if isinstance(value, numpy.generic):
                return self.encode(value.item())
        return None

    def _tensor(self, t) -> dict:
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key not in self.storages:
            entry = {"device": str(t.device), "nbytes": storage.nbytes()}
            if key in self.aliases:
                entry["alias"] = self.aliases[key]
            self.blobs.append(storage_bytes(storage))
            entry["blob"] = len(self.blobs) - 1
            self.storages[key] = len(self.storage_list)
            self.storage_list.append(entry)
        return {"storage": self.storages[key], "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape), "stride": list(t.stride()), "offset": t.storage_offset(),
                "requires_grad": bool(t.requires_grad)}


def storage_bytes(storage) -> bytes:
    """The raw bytes of a tensor storage on any device."""
    import torch

    if not storage.nbytes():
        return b""
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device)
    flat.set_(storage, 0, (storage.nbytes(),), (1,))
    return flat.cpu().numpy().tobytes()


_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")


@dataclass
class Decoder:
    """Rebuilds a value from a JSON tree and blobs, accepting only the tags below (anything else: ProtocolError)."""
    blobs: list
    storages: list
    device_map: Callable[[str], str] = lambda device: device   # where rebuilt tensors live on this side
    on_callback: Callable[[int], Any] | None = None            # worker: a callback id becomes a callable
    on_object: Callable[[dict], Any] | None = None             # worker: build a BuildInWorker
    on_handle: Callable[[int], Any] | None = None              # either side: look up / wrap a handle
    alias_storages: list = field(default_factory=list)         # judge: storages of the call's own arguments
    _built: dict = field(default_factory=dict)

    def decode(self, node: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ProtocolError("a value is nested too deeply")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v, depth + 1) for v in node]
        if not isinstance(node, dict) or len(node) == 0:
            raise ProtocolError(f"unexpected value node {str(node)[:80]!r}")
        tag = next(iter(node))
        body = node[tag]
        if tag == "tuple" and isinstance(body, list):
            return tuple(self.decode(v, depth + 1) for v in body)
        if tag == "dict" and isinstance(body, dict):
            return {str(k): self.decode(v, depth + 1) for k, v in body.items()}
        if tag == "big" and isinstance(body, str) and body.lstrip("-").isdigit() and len(body) < 400:
            return int(body)
        if tag == "dtype":
            return _dtype(body)
        if tag == "path" and isinstance(body, str) and len(body) < 4096:
            return Path(body)
        if tag == "device" and isinstance(body, str):
            import torch

            return torch.device(self.device_map(body))
        if tag == "tensor" and isinstance(body, dict):
            return self._tensor(body)
        if tag == "ndarray" and isinstance(body, dict):
            return self._ndarray(body)
        if tag == "foreign" and isinstance(body, str):
            return Foreign(body[:200])
        if tag == "handle" and self.on_handle is not None and isinstance(body, int):
            return self.on_handle(node)
        if tag == "callback" and self.on_callback is not None and isinstance(body, int):
            return self.on_callback(body)
        if tag == "object" and self.on_object is not None and isinstance(body, str):
            return self.on_object({"target": body, "args": self.decode(node.get("args", {"tuple": []}), depth + 1),
                                   "kwargs": self.decode(node.get("kwargs", {"dict": {}}), depth + 1)})
        raise ProtocolError(f"unexpected value tag {tag!r}")

    def _storage(self, index: Any):
        import torch

        if not isinstance(index, int) or not 0 <= index < len(self.storages):
            raise ProtocolError(f"a tensor names storage {index!r}, which the message does not carry")
        if index in self._built:
            return self._built[index]
        entry = self.storages[index]
        blob = self.blobs[_int(entry.get("blob"), len(self.blobs))]
        if len(blob) != _int(entry.get("nbytes"), 2**63):
            raise ProtocolError("a storage's bytes do not match its announced size")
        alias = entry.get("alias")
        built = None
        if isinstance(alias, int) and 0 <= alias < len(self.alias_storages):
            mine = self.alias_storages[alias]  # the worker says: this is the storage of your argument `alias`
            if mine.nbytes() == len(blob) and storage_bytes(mine) == blob:
                built = mine  # same bytes: rebuild as a view of the judge's own argument
        if built is None:
            cpu = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
            device = self.device_map(str(entry.get("device", "cpu")))
            built = cpu.to(device).untyped_storage() if device != "cpu" else cpu.untyped_storage()
        self._built[index] = built
        return built

    def _tensor(self, body: dict):
        import torch

        dtype = _dtype(body.get("dtype"))
        storage = self._storage(body.get("storage"))
        shape, stride = _ints(body.get("shape")), _ints(body.get("stride"))
        offset = _int(body.get("offset"), 2**62)
        if len(shape) != len(stride):
            raise ProtocolError("a tensor's shape and strides differ in length")
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if shape and min(shape) > 0:
            last = offset + sum((n - 1) * s for n, s in zip(shape, stride))
            if min(stride) < 0 or (last + 1) * itemsize > storage.nbytes():
                raise ProtocolError("a tensor's view reaches past its storage")
        out = torch.empty(0, dtype=dtype, device=storage.device)
        out.set_(storage, offset, shape, stride)
        if body.get("requires_grad") is True and (dtype.is_floating_point or dtype.is_complex):
            out.requires_grad_(True)
        return out

    def _ndarray(self, body: dict):
        import numpy

        try:
            dtype = numpy.dtype(str(body.get("dtype")))
        except TypeError:
            raise ProtocolError(f"unknown array dtype {body.get('dtype')!r}") from None
        if dtype.kind not in "biuf":
            raise ProtocolError(f"array dtype {dtype} is not accepted")
        blob = self.blobs[_int(body.get("blob"), len(self.blobs))]
        shape = _ints(body.get("shape"))
        if int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize != len(blob):
            raise ProtocolError("an array's bytes do not match its shape")
        return numpy.frombuffer(blob, dtype=dtype).reshape(shape).copy()


def _dtype(name: Any):
    import torch

    if name not in _DTYPES or not hasattr(torch, name):
        raise ProtocolError(f"unknown dtype {name!r}")
    return getattr(torch, name)


def _int(value: Any, bound: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < max(bound, 1):
        raise ProtocolError(f"expected an index below {bound}, got {str(value)[:40]!r}")
    return value


def _ints(values: Any) -> list[int]:
    if not isinstance(values, list) or len(values) > 16 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                   and abs(v) < 2**48 for v in values):
        raise ProtocolError("a tensor's shape or strides are not a short list of integers")
    return values


def encode_message(header: dict, values: dict[str, Any], encoder: Encoder) -> tuple[dict, list]:
    """Put encoded `values` (by key) into `header`, with the storage table; returns (header, blobs)."""
    for key, value in values.items():
        header[key] = encoder.encode(value)
    header["storages"] = encoder.storage_list
    return header, encoder.blobs


# ---------------------------------------------------------------------------------------------- events
def validate_event(event: Any, known_checks: set[str]) -> dict:
    """A runner-side check of one judge event: its kind, its check id and its fields' types."""
    if not isinstance(event, dict) or event.get("event") not in EVENT_KINDS:
        raise ProtocolError(f"not a grading event: {str(event)[:120]}")
    if event.get("check") not in known_checks:
        raise ProtocolError(f"an event names check {event.get('check')!r}, which lab.yaml does not define")
    if event["event"] == "calling" and not (isinstance(event.get("target"), str) and len(event["target"]) <= 300):
        raise ProtocolError("a calling event names no function")
    if event["event"] == "calling" and not (isinstance(event.get("inputs", ""), str) and len(event.get("inputs", "")) <= 300
                                            and type(event.get("elements", 0)) is int and event.get("elements", 0) >= 0):
        raise ProtocolError("a calling event describes its inputs wrongly")
    if event["event"] == "result":
        if event.get("status") not in STATUSES:
            raise ProtocolError(f"a result has status {event.get('status')!r}")
        if not isinstance(event.get("message", ""), str) or not isinstance(event.get("figures", {}), dict):
            raise ProtocolError("a result's message or figures have the wrong type")
    return event


# ---------------------------------------------------------------------------------------------- settled checks
def write_settled(path: Path, settled: dict[str, tuple[str, dict]]) -> None:
    """The runner's settled.json: check id -> (status, {figure name: the Figure's JSON object})."""
    path.write_text(json.dumps({k: {"status": s, "figures": f} for k, (s, f) in settled.items()}), encoding="utf-8")


def read_settled(path: Path) -> dict[str, tuple[str, dict]]:
    """The judge's reading of settled.json (written by the runner, which checked every figure: grading.results)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {str(k): (str(v["status"]), dict(v.get("figures") or {})) for k, v in data.items()}
