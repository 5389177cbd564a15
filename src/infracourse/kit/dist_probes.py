"""A probe that counts torch.distributed calls in one rank: calls, bytes and peers per operation (evidence).

Started by `infracourse.kit.rank_driver` (`probe="infracourse.kit.dist_probes"`): `install()` runs in each rank
before the learner's module is imported and replaces the communication functions of `torch.distributed` (and
of `torch.distributed.distributed_c10d`, the module they come from) with counting wrappers; `report()` is
saved with the rank's record. Course code in the same rank can name what is being counted:

    from infracourse.kit import dist_probes
    with dist_probes.scope("all_reduce 4096 fp32"):
        learner.ring_all_reduce(x)

Calls outside every scope are counted under OUTSIDE (the course's own barriers, say). Only the outermost call
is counted: `dist.send` is built on `dist.isend`, and counts as one send. Everything here is EVIDENCE: learner
code runs in the same process and could undo the wrappers; a grader's verdict rests on outputs compared with
its own references, and these counts are the second line that names an honest mistake (a collective where the
lab asks for point-to-point messages, messages to the wrong peer, too many bytes).
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections import defaultdict
from typing import Any

OUTSIDE = "(outside any scope)"
# point-to-point: (tensor argument, peer keyword, direction)
P2P = {"send": "sent", "isend": "sent", "recv": "received", "irecv": "received"}
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "_all_gather_base",
               "all_gather_coalesced", "all_gather_object", "reduce_scatter", "reduce_scatter_tensor",
               "_reduce_scatter_base", "all_to_all", "all_to_all_single", "gather", "scatter", "gather_object",
               "scatter_object_list", "broadcast_object_list", "all_reduce_coalesced", "barrier",
               "monitored_barrier", "send_object_list", "recv_object_list", "batch_isend_irecv")
WRAPPED = tuple(P2P) + COLLECTIVES

_state = threading.local()
_calls: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
_bytes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
_peers: dict[str, dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
_scope = [OUTSIDE]
_installed = False


def _nbytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _peer(name: str, args: tuple, kwargs: dict) -> int | None:
    """The global rank a point-to-point call talks to (dst for sends, src for receives), when it names one."""
    key = "dst" if P2P[name] == "sent" else "src"
    peer = kwargs.get(key, args[1] if len(args) > 1 else None)
    if peer is None:
        group_key = "group_" + key
        if kwargs.get(group_key) is not None:
            peer = kwargs[group_key]
    return peer if isinstance(peer, int) else None


def _wrap(name: str, fn):
    @functools.wraps(fn)
    def counted(*args, **kwargs):
        depth = getattr(_state, "depth", 0)
        if depth == 0:
            scope = _scope[-1]
            _calls[scope][name] += 1
            if name in P2P:
                tensor = args[0] if args else kwargs.get("tensor")
                _bytes[scope][P2P[name]] += _nbytes(tensor)
                peer = _peer(name, args, kwargs)
                if peer is not None:
                    _peers[scope][f"{P2P[name]} {'to' if P2P[name] == 'sent' else 'from'}"][peer] += 1
            elif name == "batch_isend_irecv":
                for op in (args[0] if args else kwargs.get("p2p_op_list", [])):
                    direction = "sent" if getattr(op.op, "__name__", "") == "isend" else "received"
                    _bytes[scope][direction] += _nbytes(op.tensor)
                    _calls[scope]["batched " + direction] += 1
                    peer = getattr(op, "peer", None)
                    if isinstance(peer, int):
                        _peers[scope][f"{direction} {'to' if direction == 'sent' else 'from'}"][peer] += 1
            else:
                _bytes[scope][name] += _nbytes(args[0] if args else None)
        _state.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _state.depth = depth

    counted.__infracourse_probe__ = True
    return counted


def install() -> None:
    """Replace the communication functions with counting ones (idempotent)."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in WRAPPED:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "__infracourse_probe__", False):
            continue
        wrapped = _wrap(name, original)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)
    _installed = True


@contextlib.contextmanager
def scope(name: str):
    """Count the calls made inside the block under `name`."""
    _scope.append(name)
    try:
        yield
    finally:
        _scope.pop()


def counts(name: str) -> dict:
    """What one scope recorded so far: {'calls': {op: n}, 'bytes': {op or sent/received: n}, 'peers': ...}."""
    return {"calls": dict(_calls.get(name, {})), "bytes": dict(_bytes.get(name, {})),
            "peers": {k: dict(v) for k, v in _peers.get(name, {}).items()}}


def report() -> dict:
    """Every scope's counts (plain dicts of str/int, loadable with weights_only=True)."""
    names = set(_calls) | set(_bytes) | set(_peers)
    return {name: counts(name) for name in sorted(names)}


def collectives_called(record: dict) -> dict[str, int]:
    """The calls in one scope's record that are not point-to-point messages."""
    return {op: n for op, n in record.get("calls", {}).items()
            if op not in P2P and not op.startswith("batched ") and op != "batch_isend_irecv" and n}


def messages_sent(record: dict) -> int:
    calls = record.get("calls", {})
    return calls.get("send", 0) + calls.get("isend", 0) + calls.get("batched sent", 0)
