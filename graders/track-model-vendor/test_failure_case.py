"""Week 24: the failure case. raw/failure.json (written by the project's run command) records a capacity sweep
on a routing where drops degrade the layer's output; the judge recomputes every row with the course reference
(kit.moe.dense_moe) and requires the numbers to agree and the degradation to be real."""
from __future__ import annotations

import json
import math

import pytest
import torch

from infracourse.grader import LabCheckFailed
from infracourse.kit import moe as kit

FILE = "raw/failure.json"
DEGRADED = 0.05   # a failure case: at some capacity factor the output is at least 5 % off the no-drop output
FIGURE_FACTOR = 1.0


def judge_row(seed: int, trace: str, world: int, factor: float) -> dict:
    c = kit.case(seed, trace, world=world)
    free = kit.dense_moe(c, kit.TOP_K, None)["out"]
    capacity = kit.capacity_for(kit.TOKENS, kit.TOP_K, kit.EXPERTS, factor)
    dropped = kit.dense_moe(c, kit.TOP_K, capacity)
    error = float(torch.linalg.norm(dropped["out"] - free) / torch.linalg.norm(free))
    total = world * kit.TOKENS * kit.TOP_K
    return {"capacity": capacity, "dropped": sum(dropped["dropped"]), "drop_fraction": sum(dropped["dropped"]) / total,
            "relative_error": error}


def _number(row: dict, key: str, where: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LabCheckFailed(f"{FILE}: {where} has {key} = {value!r}; a finite number is expected")
    return float(value)


@pytest.mark.check("capacity-failure-case")
def test_capacity_failure_case(learner, record):
    path = learner.path(FILE)
    if not path.is_file():
        raise LabCheckFailed(f"{FILE} is missing: your run command writes it (a capacity sweep on the skewed "
                             "routing: for each capacity factor, the assignments dropped and the relative error of "
                             "the layer's output against the output without a capacity); submit the file it wrote")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise LabCheckFailed(f"{FILE} is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise LabCheckFailed(f"{FILE} must be an object with trace, seed, world and rows (a list of "
                             "{capacity_factor, capacity, dropped, drop_fraction, relative_error})")
    trace, seed, world = data.get("trace"), data.get("seed"), data.get("world")
    if trace not in kit.TRACES or type(seed) is not int or world not in (2, 4):
        raise LabCheckFailed(f"{FILE} names trace {trace!r}, seed {seed!r}, world {world!r}: use one of the course's "
                             f"traces {kit.TRACES} (kit.moe.case), an integer seed and 2 or 4 ranks")
    rows = data["rows"]
    factors = []
    for i, row in enumerate(rows):
        where = f"row {i}"
        if not isinstance(row, dict):
            raise LabCheckFailed(f"{FILE}: {where} is not an object")
        factor = _number(row, "capacity_factor", where)
        if not 0 < factor <= 8:
            raise LabCheckFailed(f"{FILE}: {where} has capacity_factor {factor}; use factors in (0, 8]")
        factors.append(factor)
        want = judge_row(seed, trace, world, factor)
        where = f"row {i} (capacity factor {factor:g}, {trace} routing seed {seed}, {world} ranks)"
        for key in ("capacity", "dropped"):
            if row.get(key) != want[key]:
                raise LabCheckFailed(f"{FILE}: {where} has {key} = {row.get(key)!r}; the judge's reference gives "
                                     f"{want[key]} (capacity = ceil(factor x tokens x k / experts) per expert and "
                                     "sending rank; count every dropped assignment of every rank)")
        for key in ("drop_fraction", "relative_error"):
            got = _number(row, key, where)
            if abs(got - want[key]) > 1e-6 * max(abs(want[key]), 1e-3):
                raise LabCheckFailed(f"{FILE}: {where} has {key} = {got:.6g}; the judge measures {want[key]:.6g} "
                                     "(drop_fraction: dropped / (ranks x tokens x k); relative_error: "
                                     "||out - out without capacity|| / ||out without capacity|| over all ranks)")
        if factor == FIGURE_FACTOR:
            record("failure relative error at capacity factor 1", float(row["relative_error"]),
                   target=want["relative_error"])
            record("failure drop fraction at capacity factor 1", float(row["drop_fraction"]),
                   target=want["drop_fraction"])
    if len(set(factors)) < 3 or FIGURE_FACTOR not in factors:
        raise LabCheckFailed(f"{FILE} has capacity factors {factors}: sweep at least three, including 1.0 (the "
                             "factor the report states)")
    worst = max(float(row["relative_error"]) for row in rows)
    if worst < DEGRADED:
        raise LabCheckFailed(f"{FILE}: the largest relative error is {worst:.3g}, below {DEGRADED}: that sweep shows "
                             "no failure. Choose the routing and factors where drops do degrade the output (the "
                             "skewed trace, factors at or below 1)")
