"""The shared judging helpers of the track-model-vendor graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from infracourse.grader import LabCheckFailed, LearnerRaised, RanksRun, require_own_implementation, run_ranks
from infracourse.kit import moe as kit


CAPACITY_FACTOR = 1.0
SMALL_WORLD = ("uniform-capacity", "uniform-count")  # the experiments of the 2-rank launch


def experiments(seed: int, placement: list[list[int]] | None, world: int = kit.WORLD,
                names: tuple[str, ...] | None = None) -> list[dict]:
    contiguous = kit.contiguous_placement(kit.EXPERTS, world)
    cap = kit.capacity_for(kit.TOKENS, kit.TOP_K, kit.EXPERTS, CAPACITY_FACTOR)
    found = [
        {"name": "uniform-capacity", "seed": seed, "trace": "uniform", "placement": contiguous, "capacity": cap,
         "counting": False},
        {"name": "uniform-count", "seed": seed, "trace": "uniform", "placement": contiguous, "capacity": cap,
         "counting": True},
        {"name": "uniform-free", "seed": seed, "trace": "uniform", "placement": contiguous, "capacity": None,
         "counting": True},
        {"name": "skewed-contiguous", "seed": kit.FIXED_SEED, "trace": "skewed", "placement": contiguous,
         "capacity": None, "counting": False},
    ]
    if placement is not None:
        found.append({"name": "skewed-eplb", "seed": kit.FIXED_SEED, "trace": "skewed", "placement": placement,
                      "capacity": None, "counting": False})
    return [spec for spec in found if names is None or spec["name"] in names]


@dataclass
class Launch:
    """One launch of the learner's ep_moe and what the judge knows about it."""
    run: RanksRun
    seed: int
    world: int
    specs: dict[str, dict]
    placement: list[list[int]] | None
    placement_error: str | None
    references: dict[str, dict] = field(default_factory=dict)

    def where(self, name: str) -> str:
        spec = self.specs[name]
        cap = "no capacity" if spec["capacity"] is None else f"capacity {spec['capacity']} per expert and rank"
        return (f"(experiment {name}: {spec['trace']} routing seed {spec['seed']}, {self.world} ranks, "
                f"{kit.TOKENS} tokens per rank, {kit.EXPERTS} experts, top-{kit.TOP_K}, {cap})")

    def case(self, name: str) -> dict:
        spec = self.specs[name]
        return kit.case(spec["seed"], spec["trace"], world=self.world)

    def reference(self, name: str) -> dict:
        if name not in self.references:
            self.references[name] = kit.dense_moe(self.case(name), kit.TOP_K, self.specs[name]["capacity"])
        return self.references[name]

    def results(self, name: str) -> list[dict]:
        """Every rank's result of one experiment; fails naming the rank and the learner's traceback."""
        if name not in self.specs:
            raise LabCheckFailed(f"the experiment {name} did not run: eplb_placement gave no placement "
                                 f"({self.placement_error})")
        if (failure := self.run.failure()) is not None:
            raise LabCheckFailed(f"the {self.world}-rank launch (torchrun, gloo) that runs your ep_moe failed "
                                 f"(seed {self.seed}): {failure}")
        per_rank = [out.get(name) if isinstance(out, dict) else None for out in self.run.outputs]
        for rank, result in enumerate(per_rank):
            if isinstance(result, dict) and "error" in result:
                if result.get("not_written"):
                    raise LabCheckFailed(f"ep_moe (moe.py) is not written yet: it raised NotImplementedError on "
                                         f"rank {rank} {self.where(name)}")
                raise LabCheckFailed(f"ep_moe raised on rank {rank} {self.where(name)}:\n{result['error']}")
            if not isinstance(result, dict):
                raise LabCheckFailed(f"rank {rank} returned nothing for {name}: an earlier experiment raised "
                                     f"(seed {self.seed})")
        return per_rank

    def calls(self, rank: int, name: str) -> dict[str, int]:
        probe = self.run.probes[rank] or {}
        return dict(probe.get(name, {}).get("calls", {}))


def learner_placement(learner, load: list[int], world: int) -> tuple[list | None, str | None]:
    try:
        placement = learner.module("moe").eplb_placement(list(load), world, kit.slots_for(world))
    except LearnerRaised as exc:  # the learner's function raised in the worker: its message is theirs
        if exc.type_name == "NotImplementedError":
            return None, f"eplb_placement is not written yet: {exc.message}"
        return None, f"eplb_placement raised {str(exc)[:400]}"
    placement = [list(row) for row in placement] if isinstance(placement, (list, tuple)) else placement
    if (problem := kit.check_placement(placement, kit.EXPERTS, world, kit.slots_for(world))) is not None:
        return None, f"eplb_placement({load}, {world}, {kit.slots_for(world)}) is not a valid placement: {problem}"
    return placement, None


def all_to_all_bytes(tokens: int, hidden: int, top_k: int, world: int, dtype_bytes: int) -> float:
    """The estimate's reference formula, judge side only (in kit.moe, mounted, an estimates.py returning it passed
    all-to-all-bytes): bytes one rank sends to OTHER ranks in one forward (dispatch + combine), no drops, each
    assignment equally likely to land on any rank: 2 * tokens * k * hidden * dtype_bytes * (world - 1) / world."""
    return 2 * tokens * top_k * hidden * dtype_bytes * (world - 1) / world


def skewed_load(seed: int, world: int = kit.WORLD) -> list[int]:
    ref = kit.dense_moe(kit.case(seed, "skewed", world=world), kit.TOP_K, None)
    return kit.routing_stats(ref["expert"].reshape(-1, kit.TOP_K), None, kit.EXPERTS, world)["tokens_per_expert"]


def refuse_reference_imports(learner_root: Path) -> None:
    """moe.py may not reach kit.moe, the grader's reference the handout names (to read): a dense_moe that calls
    kit.dense_moe is the judge's answer returned as the learner's. run.py may, for the traces it measures on."""
    require_own_implementation(learner_root, "moe.py", ("infracourse.kit.moe",),
                               "write route, keep_within_capacity, dense_moe, routing_stats, eplb_placement and "
                               "ep_moe yourself (read the reference, do not call it); run.py may use the kit's traces")


def launch(learner, seed: int, scratch: Path, device: str = "cpu", world: int = kit.WORLD,
           names: tuple[str, ...] | None = None) -> Launch:
    refuse_reference_imports(learner.root)
    rebalance = world > 1 and (names is None or "skewed-eplb" in names)
    placement, error = (learner_placement(learner, skewed_load(kit.FIXED_SEED, world), world) if rebalance
                        else (None, "this launch does not rebalance"))
    specs = experiments(seed, placement, world, names)
    run = run_ranks("infracourse.kit.moe", "grade_rank", learner_dir=learner.root, world_size=world,
                    kwargs={"experiments": specs}, device=device, probe="infracourse.kit.dist_probes",
                    timeout_s=100, scratch=scratch)
    return Launch(run, seed, world, {s["name"]: s for s in specs}, placement, error)


def counted_pairs(per_rank: list[dict], world: int) -> dict[tuple[int, int], int]:
    """(token id, logical expert) -> how many times some replica of that expert was given the token."""
    pairs: dict[tuple[int, int], int] = {}
    for result in per_rank:
        for record in result["experts"]:
            for token in record["seen"]:
                key = (int(token), int(record["expert"]))
                pairs[key] = pairs.get(key, 0) + 1
    return pairs


def expected_pairs(reference: dict) -> tuple[set, set]:
    """(kept, dropped) (token id, expert) pairs of the reference."""
    world, tokens, k = reference["expert"].shape
    kept, dropped = set(), set()
    for rank in range(world):
        for t in range(tokens):
            for j in range(k):
                pair = (rank * tokens + t, int(reference["expert"][rank, t, j]))
                (kept if reference["kept"][rank, t, j] else dropped).add(pair)
    return kept, dropped


def require_all_to_all(launch: Launch, name: str) -> None:
    launch.results(name)  # the function ran on every rank: its calls were counted
    for rank in range(launch.world):
        calls = launch.calls(rank, name)
        if not any(calls.get(op) for op in ("all_to_all", "all_to_all_single")):
            seen = {op: n for op, n in calls.items() if n} or "no collective calls"
            raise LabCheckFailed(f"rank {rank}: ep_moe made {seen} {launch.where(name)}; tokens go to the ranks "
                                 "that hold their experts with all_to_all (dispatch) and come back the same way "
                                 "(combine): dist.all_to_all_single or dist.all_to_all")


def compare_outputs(launch: Launch, name: str) -> None:
    reference = launch.reference(name)
    for rank, result in enumerate(launch.results(name)):
        got, want = result["out"], reference["out"][rank]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise LabCheckFailed(f"rank {rank}: ep_moe's out is {shape}, expected a tensor of shape "
                                 f"{tuple(want.shape)} (this rank's tokens) {launch.where(name)}")
        got = got.to(want.dtype)
        bad = (got - want).abs().amax(-1) > 1e-9 * (1 + want.abs().amax(-1))
        if bad.any():
            tokens = bad.nonzero().flatten().tolist()
            t = tokens[0]
            raise LabCheckFailed(
                f"rank {rank}: ep_moe's output differs from the dense single-process MoE (kit.moe.dense_moe) at "
                f"{len(tokens)} of {kit.TOKENS} tokens, first token {t} (max error "
                f"{float((got[t] - want[t]).abs().max()):.3g}) {launch.where(name)}. Each token's output is the "
                "sum over its KEPT choices of gate x expert(token), gates = softmax over its top-k logits, not "
                "renormalised after a drop; every output row must come back to the token that sent it")


def pairs_once(ep, name: str) -> None:
    per_rank = ep.results(name)
    kept, dropped = expected_pairs(ep.reference(name))
    counted = counted_pairs(per_rank, ep.world)
    where = ep.where(name)
    for rank, result in enumerate(per_rank):
        for record in result["experts"]:
            if record["unknown"]:
                raise LabCheckFailed(
                    f"rank {rank}: the replica of expert {record['expert']} was given {record['unknown']} rows that "
                    f"are no token of any rank {where}: send each token's row unchanged (not scaled by its gate, "
                    "not mixed with others); padding rows, if you use fixed-size buffers, must be zeros")
    twice = sorted(p for p, n in counted.items() if n > 1)
    if twice:
        t, e = twice[0]
        raise LabCheckFailed(f"{len(twice)} (token, expert) pairs were dispatched more than once, e.g. token {t} "
                             f"(rank {t // kit.TOKENS}, position {t % kit.TOKENS}) reached expert {e} "
                             f"{counted[twice[0]]} times {where}: each kept assignment goes to exactly one replica "
                             "of its expert, once")
    stray = sorted(p for p in counted if p not in kept and p not in dropped)
    if stray:
        t, e = stray[0]
        raise LabCheckFailed(f"token {t} reached expert {e}, which is not among its top-{kit.TOP_K} choices "
                             f"{where}: dispatch each row to the rank holding the expert it chose")
    late = sorted(p for p in counted if p in dropped)
    if late:
        t, e = late[0]
        raise LabCheckFailed(f"{len(late)} dropped assignments still reached their expert, e.g. token {t} -> expert "
                             f"{e} {where}: an assignment past capacity is dropped before dispatch (it costs no "
                             "all_to_all bytes and no expert work)")
    missing = sorted(kept - set(counted))
    if missing:
        t, e = missing[0]
        raise LabCheckFailed(f"{len(missing)} kept assignments never reached their expert, e.g. token {t} "
                             f"(rank {t // kit.TOKENS}) -> expert {e} {where}: every assignment within capacity "
                             "is dispatched once")


def combined_once(ep, name: str) -> None:
    """Counting experts return the one-hot row of their expert: out[t, e] = (times (t, e) was combined) x gate."""
    reference = ep.reference(name)
    where = ep.where(name)
    for rank, result in enumerate(ep.results(name)):
        out = result["out"]
        if out is None or tuple(out.shape) != (kit.TOKENS, kit.D_MODEL):
            raise LabCheckFailed(f"rank {rank}: ep_moe's out is not a ({kit.TOKENS}, {kit.D_MODEL}) tensor {where}")
        out = out.double()
        for t in range(kit.TOKENS):
            gates = {int(e): float(g) for e, g, k in zip(reference["expert"][rank, t], reference["gate"][rank, t],
                                                         reference["kept"][rank, t])}
            kept = {int(e) for e, k in zip(reference["expert"][rank, t], reference["kept"][rank, t]) if k}
            for e in range(kit.D_MODEL):
                value = float(out[t, e])
                times = round(value / gates[e]) if e in gates and gates[e] > 0 else (0 if abs(value) < 1e-9 else -1)
                expected = 1 if e in kept else 0
                if times != expected or (e in gates and abs(value - times * gates[e]) > 1e-9):
                    what = (f"{value / gates[e]:.3g} times its gate" if e in gates else f"{value:.3g}")
                    raise LabCheckFailed(
                        f"rank {rank}, token {t}: the combine added expert {e}'s output {what}, expected "
                        f"{expected} time{'s' if expected != 1 else ''} {where} (the course's counting experts "
                        "return the one-hot row of their expert id, so the combined row counts each (token, "
                        "expert) pair). Each returned row is added once, to the token that sent it, weighted by "
                        "that choice's gate; a dropped choice adds nothing")
