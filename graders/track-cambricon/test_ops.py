"""Week 23: the operator list and the call chain. The judge exports the model itself (kit.porting.traced_ops)
and asks the dispatcher; an op's MLU status and kernel come from the vendor's documentation and are to be
verified on a device: their presence is checked, never their truth."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infracourse.grader import LabCheckFailed
from infracourse.kit.porting import cpu_kernel_key, dispatch_keys, has_kernel, python_callable, resolve_op, traced_ops
from track_cambricon_judging import BATCH, OTHER, learner_module, model_of, read_raw

STATUSES = ("supported", "partial", "unsupported", "not a kernel", "unknown")
DEVICE_KEYS = ("PrivateUse1", "AutogradPrivateUse1")  # where an out-of-tree backend such as torch_mlu registers
COMPOSITE_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
TO_BE_VERIFIED = "to be verified"


def _diff(mine: dict, ours: dict, what: str) -> None:
    missing = {op: n for op, n in ours.items() if op not in mine}
    extra = sorted(op for op in mine if op not in ours)
    counts = {op: (mine[op], n) for op, n in ours.items() if op in mine and mine[op] != n}
    if missing or extra or counts:
        raise LabCheckFailed(
            f"{what} is not the exported graph's op list ({sum(ours.values())} calls of {len(ours)} aten "
            "overloads): " + "; ".join(filter(None, [
                f"missing {missing}" if missing else "", f"not in the graph {extra}" if extra else "",
                "counts (yours, the graph's) " + str(counts) if counts else ""]))
            + ". Count every call_function node with an OpOverload target of torch.export.export(model, (ids,)).graph, "
            "views and export's assertions included")


@pytest.mark.check("op-list")
def test_op_list(learner, record):
    ops = learner_module(learner, "ops")
    for model, batch in (({}, BATCH), (OTHER, 3)):
        got = ops.traced_ops(model, batch)
        if not isinstance(got, dict) or not all(isinstance(k, str) and type(v) is int for k, v in got.items()):
            raise LabCheckFailed(f"ops.traced_ops({model}, {batch}) returned {str(got)[:120]}: return "
                                 "{op name: count}")
        _diff(got, dict(traced_ops(model, batch)), f"ops.traced_ops({model}, {batch})")
    data = read_raw(learner, "ops.json")
    model, batch = model_of(data, "ops.json"), data.get("batch")
    entries = data.get("ops")
    well_formed = isinstance(entries, list) and all(
        isinstance(e, dict) and isinstance(e.get("op"), str) and type(e.get("count")) is int for e in entries)
    if type(batch) is not int or not 1 <= batch <= 64 or not well_formed:
        raise LabCheckFailed("raw/ops.json needs `model`, `batch` (1..64) and `ops`: [{op, count, mlu_status, "
                             "source}, ...], as the handout shows")
    ours = dict(traced_ops(model, batch))
    listed = [e["op"] for e in entries]
    if len(set(listed)) != len(listed):
        raise LabCheckFailed(f"raw/ops.json lists {sorted({o for o in listed if listed.count(o) > 1})} more than once")
    _diff({e["op"]: e["count"] for e in entries}, ours, f"raw/ops.json (model {model}, batch {batch})")
    unset = [e["op"] for e in entries if e.get("mlu_status") not in STATUSES]
    if unset:
        raise LabCheckFailed(f"raw/ops.json: {unset} have no mlu_status; give each op one of {STATUSES}, from the "
                             "vendor's operator list (it is to be verified on an MLU, not graded as fact)")
    record("aten ops", sum(ours.values()))
    record("distinct aten ops", len(ours))


def _entry_problem(entry: dict, keys: set[str]) -> str | None:
    op = resolve_op(str(entry.get("op")))
    if op is None:
        return f"{entry.get('op')!r} is not an aten op overload torch knows (write it as aten.NAME.OVERLOAD)"
    if python_callable(str(entry.get("python_api"))) is None:
        return f"python_api {entry.get('python_api')!r} does not resolve to a callable under torch"
    cpu, device = entry.get("cpu_key"), entry.get("device_key")
    for label, key in (("cpu_key", cpu), ("device_key", device)):
        if key not in keys:
            return f"{label} {key!r} is not a dispatch key (torch._C.DispatchKey has no such member)"
    actual = cpu_kernel_key(op)
    if cpu != actual:
        return (f"cpu_key {cpu!r}, but for a CPU tensor the dispatcher runs the kernel registered at {actual!r} "
                f"(torch._C._dispatch_has_kernel_for_dispatch_key({op.name()!r}, key); a backend kernel is "
                "preferred to a composite one)")
    composites = [key for key in COMPOSITE_KEYS if has_kernel(op, key)]
    if device not in DEVICE_KEYS and device not in composites:
        return (f"device_key {device!r}: an out-of-tree backend such as torch_mlu registers its kernels at "
                f"{' / '.join(DEVICE_KEYS)}" + (f"; or, where the backend registers none, this op's composite "
                                                f"kernel serves every device: {' / '.join(composites)}"
                                                if composites else ""))
    if str(entry.get("mlu_kernel", "")).strip().lower() != TO_BE_VERIFIED:
        return f"mlu_kernel must say {TO_BE_VERIFIED!r}: no MLU ran it here"
    return None


@pytest.mark.check("call-chain")
def test_call_chain(learner):
    path: Path = learner.path("call_chain.yaml")
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    except yaml.YAMLError as exc:
        raise LabCheckFailed(f"call_chain.yaml is not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise LabCheckFailed("call_chain.yaml: write a list with one entry per op of the model's graph, each "
                             "{op, python_api, cpu_key, device_key, mlu_kernel}, as the handout shows")
    ours = traced_ops({}, BATCH)
    by_op = {str(e.get("op")): e for e in entries}
    missing = sorted(op for op in ours if op not in by_op)
    if missing:
        raise LabCheckFailed(f"call_chain.yaml has no entry for {missing}: every op of the exported graph (your "
                             "raw/ops.json) needs its chain")
    keys = dispatch_keys()
    for entry in entries:
        problem = _entry_problem(entry, keys)
        if problem:
            raise LabCheckFailed(f"call_chain.yaml, {entry.get('op')}: {problem}")
