"""Model-vendor track (weeks 22-24): a small mixture-of-experts layer, expert-parallel over all_to_all.

Course code, frozen: the judge trusts only what is computed here or counted by the modules defined here.

Judge side
- `case(seed, trace)`: every rank's tokens x (world, T, d) and router logits (world, T, E), every expert's
  weights; trace "uniform" (logits iid normal) or "skewed" (a few hot experts get a bias: the routing that
  overloads one rank under the contiguous placement, as in DeepSeek-V3's EPLB motivation).
- `route`, `capacity_for`, `kept_mask`, `dense_moe`: the single-process reference. Top-k of the logits; the gates
  are the softmax over the k chosen logits (the full softmax renormalised over the top k); an assignment is
  (token, choice j); with a capacity C each rank sends at most C assignments to each logical expert, the first
  in row-major order of the (T, k) choices (token order, then the choice order); the rest are dropped: they
  contribute nothing and are counted. Gates are not renormalised after a drop.
- `routing_stats`, `imbalance`, `contiguous_placement`, `rank_loads`, `balanced_split_loads`: load statistics.
  (The all-to-all estimate's formula is graders/track-model-vendor/track_model_vendor_judging.py's: here, mounted,
  an estimates.py could return it as its own.)

Rank side
- `Expert`: one expert replica (gelu(x @ w_in) @ w_out, or, counting, the one-hot row of its logical expert id)
  that records WHICH tokens it was given: each row is matched, bit for bit, against the table of every rank's
  tokens (token id = rank * T + t). Rows of zeros are padding (a fixed-capacity buffer), counted apart.
- `grade_rank`: started by grading.torchrun with probe infracourse.kit.dist_probes; runs the judge's experiments
  on the learner's `ep_moe` (moe.py) and returns outputs, the learner's claims, and the experts' records.
  Evidence only: the learner's code shares the process; the verdicts compare it with the references above.
"""
from __future__ import annotations

import math
import traceback

import torch
import torch.nn.functional as F

from infracourse.kit import dist_probes

WORLD, EXPERTS, TOP_K = 4, 8, 2
TOKENS, D_MODEL, FFN = 32, 16, 16          # per rank; D_MODEL >= EXPERTS so a counting expert's one-hot fits
SLOTS_PER_RANK = EXPERTS // WORLD + 1      # EPLB: one redundant expert slot per rank (slots_for(world))
FIXED_SEED = 2024                          # the fixed skewed trace whose loads the report states
SKEW = (3.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # logit bias of the skewed trace, by expert
TRACES = ("uniform", "skewed")


# ------------------------------------------------------------------------------------------------ the workload
def case(seed: int, trace: str = "uniform", world: int = WORLD, tokens: int = TOKENS, d_model: int = D_MODEL,
         ffn: int = FFN, experts: int = EXPERTS) -> dict:
    """Every rank's tokens and router logits, and every expert's weights (float64, CPU, from the seed)."""
    if trace not in TRACES:
        raise ValueError(f"trace {trace!r}: use one of {TRACES}")
    g = torch.Generator().manual_seed(seed * 7919 + (1 if trace == "skewed" else 0))
    r = lambda *shape, s=1.0: torch.randn(*shape, generator=g, dtype=torch.float64) * s  # noqa: E731
    x = r(world, tokens, d_model)
    logits = r(world, tokens, experts)
    if trace == "skewed":
        bias = torch.tensor([SKEW[e % len(SKEW)] if e < len(SKEW) else 0.0 for e in range(experts)],
                            dtype=torch.float64)
        logits = logits + bias
    return {"x": x, "logits": logits, "w_in": r(experts, d_model, ffn, s=0.3), "w_out": r(experts, ffn, d_model, s=0.3),
            "trace": trace, "seed": seed}


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids (T, k), gates (T, k)): the k largest logits, best first; gates = softmax over those k."""
    top, expert = logits.topk(top_k, dim=-1)
    return expert, torch.softmax(top, dim=-1)


def capacity_for(tokens: int, top_k: int, experts: int, factor: float | None) -> int | None:
    """Assignments one rank may send to one logical expert: ceil(factor * tokens * k / E); None: no limit."""
    if factor is None:
        return None
    return int(math.ceil(factor * tokens * top_k / experts - 1e-9))


def kept_mask(expert: torch.Tensor, capacity: int | None, experts: int) -> torch.Tensor:
    """(T, k) bool: the assignments within capacity, first come in row-major (token, choice) order."""
    flat = expert.reshape(-1)
    if capacity is None:
        return torch.ones_like(expert, dtype=torch.bool)
    place = torch.zeros_like(flat)
    seen = [0] * experts
    for i, e in enumerate(flat.tolist()):
        place[i] = seen[e]
        seen[e] += 1
    return (place < capacity).reshape(expert.shape)


def expert_fn(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w_in) @ w_out


def dense_moe(c: dict, top_k: int = TOP_K, capacity: int | None = None) -> dict:
    """The single-process reference for every rank: out (world, T, d), dropped per rank, kept (world, T, k),
    expert ids and gates (world, T, k)."""
    world, tokens, _ = c["x"].shape
    experts = c["logits"].shape[-1]
    outs, dropped, kepts, ids, gates = [], [], [], [], []
    for rank in range(world):
        x = c["x"][rank]
        expert, gate = route(c["logits"][rank], top_k)
        kept = kept_mask(expert, capacity, experts)
        out = torch.zeros_like(x)
        for e in range(experts):
            rows = (expert == e) & kept
            tok, j = rows.nonzero(as_tuple=True)
            if len(tok):
                out.index_add_(0, tok, gate[tok, j][:, None] * expert_fn(x[tok], c["w_in"][e], c["w_out"][e]))
        outs.append(out)
        dropped.append(int((~kept).sum()))
        kepts.append(kept)
        ids.append(expert)
        gates.append(gate)
    return {"out": torch.stack(outs), "dropped": dropped, "kept": torch.stack(kepts), "expert": torch.stack(ids),
            "gate": torch.stack(gates)}


# ------------------------------------------------------------------------------------------- load statistics
def contiguous_placement(experts: int = EXPERTS, world: int = WORLD) -> list[list[int]]:
    """Expert e on rank e // (E / world): the placement before any rebalancing."""
    per = experts // world
    return [list(range(r * per, (r + 1) * per)) for r in range(world)]


def imbalance(loads: list[float]) -> float:
    """max / mean of a load vector (1.0: perfectly balanced); 0 loads -> 1.0."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0


def routing_stats(expert: torch.Tensor, kept: torch.Tensor | None = None, experts: int = EXPERTS,
                  world: int = WORLD) -> dict:
    """Tokens (kept assignments) per logical expert and per rank under the contiguous placement, and the
    max/mean imbalance of each."""
    ids = expert.reshape(-1) if kept is None else expert[kept].reshape(-1)
    per_expert = torch.bincount(ids, minlength=experts).tolist()
    per = experts // world
    per_rank = [sum(per_expert[r * per:(r + 1) * per]) for r in range(world)]
    return {"tokens_per_expert": per_expert, "tokens_per_rank": per_rank,
            "expert_imbalance": imbalance(per_expert), "rank_imbalance": imbalance(per_rank)}


def slots_for(world: int, experts: int = EXPERTS) -> int:
    """Expert slots per rank in the EPLB experiments: the contiguous share plus one redundant slot."""
    return experts // world + 1


def check_placement(placement, experts: int = EXPERTS, world: int = WORLD, slots: int = SLOTS_PER_RANK) -> str | None:
    """None when `placement` (a list per rank of logical expert ids) is a valid EPLB placement, else why not."""
    if not isinstance(placement, (list, tuple)) or len(placement) != world:
        return f"it must be a list of {world} lists (one per rank), got {str(placement)[:120]}"
    for r, row in enumerate(placement):
        if not isinstance(row, (list, tuple)) or len(row) != slots:
            return f"rank {r} holds {row!r}; every rank holds exactly {slots} expert slots"
        if any(type(e) is not int or not 0 <= e < experts for e in row):
            return f"rank {r} holds {row!r}; slots hold logical expert ids 0..{experts - 1} (plain ints)"
    missing = sorted(set(range(experts)) - {e for row in placement for e in row})
    if missing:
        return f"experts {missing} have no replica on any rank: every logical expert needs at least one"
    return None


def balanced_split_loads(placement: list[list[int]], per_expert: list[int]) -> list[float]:
    """Each rank's load if every expert's tokens are split evenly over its replicas (the EPLB model)."""
    replicas = [0] * len(per_expert)
    for row in placement:
        for e in row:
            replicas[e] += 1
    return [sum(per_expert[e] / replicas[e] for e in row) for row in placement]


# --------------------------------------------------------------------------------------------- in each rank
class Expert(torch.nn.Module):
    """One replica of logical expert `expert_id` that records the ids of the tokens it was given."""

    def __init__(self, expert_id: int, w_in: torch.Tensor, w_out: torch.Tensor, table: torch.Tensor,
                 counting: bool = False):
        super().__init__()
        self.expert_id, self.w_in, self.w_out, self.table, self.counting = expert_id, w_in, w_out, table, counting
        self.seen: list[int] = []
        self.padding = 0
        self.unknown = 0
        self.calls = 0

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if rows.dim() != 2 or rows.shape[-1] != self.table.shape[-1]:
            raise ValueError(f"expert {self.expert_id} takes rows of shape (n, {self.table.shape[-1]}), got "
                             f"{tuple(rows.shape)}")
        if rows.shape[0]:
            r = rows.detach().to(self.table.dtype)
            match = (r[:, None, :] == self.table[None]).all(-1)
            found = match.any(-1)
            zero = (r == 0).all(-1)
            self.seen += match.float().argmax(-1)[found].tolist()
            self.padding += int((zero & ~found).sum())
            self.unknown += int((~zero & ~found).sum())
        if self.counting:
            out = torch.zeros_like(rows)
            out[:, self.expert_id] = 1.0
            return out
        return expert_fn(rows, self.w_in, self.w_out)

    def record(self) -> dict:
        return {"expert": self.expert_id, "seen": list(self.seen), "padding": self.padding, "unknown": self.unknown,
                "calls": self.calls}


def _cpu(t):
    return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else t


def _experiment(learner, c: dict, placement: list[list[int]], top_k: int, capacity: int | None, counting: bool,
                device: str) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    table = c["x"].reshape(-1, c["x"].shape[-1]).to(device)
    experts = [Expert(e, c["w_in"][e].to(device), c["w_out"][e].to(device), table, counting)
               for e in placement[rank]]
    result = learner.ep_moe(c["x"][rank].to(device).clone(), c["logits"][rank].to(device).clone(), experts,
                            [list(row) for row in placement], top_k, capacity)
    if not isinstance(result, dict):
        raise TypeError(f"ep_moe returned {type(result).__name__}; return a dict with out, dropped, load")
    out, dropped, load = result.get("out"), result.get("dropped"), result.get("load")
    if isinstance(load, torch.Tensor):
        load = load.tolist()

    def whole(v) -> bool:  # a count: an int, or a float / one-element tensor holding one
        if isinstance(v, bool) or not isinstance(v, (int, float, torch.Tensor)):
            return False
        if isinstance(v, torch.Tensor) and v.numel() != 1:
            return False
        return math.isfinite(float(v)) and float(v) == int(v)

    return {"out": _cpu(out) if isinstance(out, torch.Tensor) else None,
            "dropped": int(dropped) if whole(dropped) else None,
            "load": [int(v) for v in load] if isinstance(load, (list, tuple)) and all(map(whole, load)) else None,
            "experts": [e.record() for e in experts]}


def grade_rank(experiments: list[dict], top_k: int = TOP_K, module: str = "moe") -> dict:
    """Run the judge's experiments on the learner's ep_moe in this rank. Each experiment: {"name", "seed",
    "trace", "placement", "capacity", "counting"}. Counted under the probe scope of its name."""
    import importlib

    import torch.distributed as dist

    torch.set_num_threads(1)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    results: dict = {}
    try:
        learner = importlib.import_module(module)
    except Exception as exc:  # every experiment reports the import error
        error = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-2000:]
        return {e["name"]: {"error": error, "not_written": False} for e in experiments}
    for spec in experiments:
        name = spec["name"]
        c = case(spec["seed"], spec["trace"], world=dist.get_world_size())
        dist.barrier()
        try:
            with dist_probes.scope(name):
                results[name] = _experiment(learner, c, spec["placement"], top_k, spec["capacity"],
                                            spec["counting"], device)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # the learner's: the ranks raise alike on the same inputs (NotImplementedError)
            tail = traceback.format_exception(type(exc), exc, exc.__traceback__)
            results[name] = {"error": "".join(tail)[-2000:], "not_written": isinstance(exc, NotImplementedError)}
            break  # a rank that raised while others wait in a collective: stop here, the launch's timeout ends it
    return results
