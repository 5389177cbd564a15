"""Week 14 course code that runs beside the learner's: the inputs of the tensor-, pipeline- and expert-parallel
experiments and of the elastic run (generated from the grade's seed), the experts that count the rows they are
given, and `grade_rank`, which runs in each rank around the learner's code (evidence only). The sandbox mounts
this module for the ranks and the worker, so it holds no answer: the dense references, the schedule rules and
the uninterrupted elastic run the judge compares with live in graders/week14/week14_references.py, never mounted.

Reading order: tensor-parallel MLP -> the 2-stage model -> mixture of experts -> elastic training -> what each
rank runs.
"""
from __future__ import annotations

import traceback

import torch
import torch.nn.functional as F

from infracourse.kit import dist_probes

# ------------------------------------------------------------------------------------------ tensor parallel
def mlp_weights(seed: int, tokens: int = 6, d_model: int = 8, hidden: int = 12) -> dict:
    """x (tokens, d), w1 (hidden, d), b1 (hidden,), w2 (d, hidden), b2 (d,), dy (tokens, d): the MLP block
    y = gelu(x @ w1.T + b1) @ w2.T + b2 and the gradient the judge sends back through it."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape, s=1.0: torch.randn(*shape, generator=g, dtype=torch.float64) * s  # noqa: E731
    return {"x": r(tokens, d_model), "w1": r(hidden, d_model, s=0.3), "b1": r(hidden, s=0.1),
            "w2": r(d_model, hidden, s=0.3), "b2": r(d_model, s=0.1), "dy": r(tokens, d_model)}


def mlp_shard(weights: dict, rank: int, world: int) -> dict:
    """Megatron's split: w1 and b1 by output rows (column-parallel), w2 by input columns (row-parallel); x and
    b2 whole on every rank."""
    rows = weights["w1"].shape[0] // world
    part = slice(rank * rows, (rank + 1) * rows)
    return {"x": weights["x"], "w1": weights["w1"][part], "b1": weights["b1"][part], "w2": weights["w2"][:, part],
            "b2": weights["b2"]}


# ------------------------------------------------------------------------------------------------ pipeline
def two_stage_weights(seed: int, batch: int = 8, d_in: int = 6, hidden: int = 10, d_out: int = 4) -> dict:
    """Stage 0: h = tanh(x @ w0.T + b0); stage 1: out = h @ w1.T + b1; loss = mean squared error over the whole
    batch (float64)."""
    g = torch.Generator().manual_seed(seed + 1)
    r = lambda *shape, s=1.0: torch.randn(*shape, generator=g, dtype=torch.float64) * s  # noqa: E731
    return {"x": r(batch, d_in), "target": r(batch, d_out), "w0": r(hidden, d_in, s=0.4), "b0": r(hidden, s=0.1),
            "w1": r(d_out, hidden, s=0.4), "b1": r(d_out, s=0.1)}


# --------------------------------------------------------------------------------------- mixture of experts
class Expert(torch.nn.Module):
    """One expert, gelu(x @ w_in) @ w_out, that counts the token rows it is given (evidence of dispatch)."""

    def __init__(self, w_in: torch.Tensor, w_out: torch.Tensor):
        super().__init__()
        self.w_in, self.w_out = w_in, w_out
        self.rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += int(x.shape[0])
        return F.gelu(x @ self.w_in) @ self.w_out


def moe_weights(seed: int, world: int = 2, tokens: int = 10, d_model: int = 6, ffn: int = 8,
                experts: int = 4) -> dict:
    """Each rank's tokens x (world, tokens, d), the router (d, experts), every expert's w_in (experts, d, ffn)
    and w_out (experts, ffn, d); experts e*E/world .. live on rank e // (E/world)."""
    g = torch.Generator().manual_seed(seed + 2)
    r = lambda *shape, s=1.0: torch.randn(*shape, generator=g, dtype=torch.float64) * s  # noqa: E731
    return {"x": r(world, tokens, d_model), "router": r(d_model, experts), "w_in": r(experts, d_model, ffn, s=0.4),
            "w_out": r(experts, ffn, d_model, s=0.4)}


# ----------------------------------------------------------------------------------------- elastic training
ELASTIC = {"d_in": 6, "hidden": 16, "d_out": 3, "batch": 8, "lr": 0.05, "momentum": 0.9}


def elastic_params(seed: int) -> dict[str, torch.Tensor]:
    """The model every rank starts from (fp32): w1 (hidden, d_in), w2 (d_out, hidden)."""
    g = torch.Generator().manual_seed(seed + 3)
    c = ELASTIC
    return {"w1": torch.randn(c["hidden"], c["d_in"], generator=g) * 0.3,
            "w2": torch.randn(c["d_out"], c["hidden"], generator=g) * 0.3}


def elastic_batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s batch of step `step` (1-based): a pure function of the three, so a resumed run sees the
    same data without any saved data position."""
    g = torch.Generator().manual_seed(seed * 100_003 + step * 1_009 + rank)
    c = ELASTIC
    x = torch.randn(c["batch"], c["d_in"], generator=g)
    return x, torch.sin(x[:, : c["d_out"]] * 2) + 0.1 * torch.randn(c["batch"], c["d_out"], generator=g)


def elastic_loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(torch.tanh(x @ params["w1"].T) @ params["w2"].T, y)


# ------------------------------------------------------------------------------------------ in each rank
def _attempt(results: dict, name: str, fn) -> None:
    """Run one experiment; a learner exception is kept as its traceback's tail, the other experiments still run
    (an exception on one rank only leaves the other waiting: the launch's time limit ends it)."""
    print(f"[rank {torch.distributed.get_rank()}] {name}", flush=True)
    try:
        with dist_probes.scope(name):
            results[name] = fn()
    except Exception as exc:
        tail = traceback.format_exception(type(exc), exc, exc.__traceback__)
        results[name] = {"error": "".join(tail)[-2000:], "not_written": isinstance(exc, NotImplementedError)}


def _cpu(t):
    return None if t is None else t.detach().cpu()


def _tensor_parallel(learner, seed: int, device: str) -> dict:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    weights = mlp_weights(seed)
    shard = {k: v.to(device).clone().requires_grad_() for k, v in mlp_shard(weights, rank, world).items()}
    with dist_probes.scope("tp forward"):
        y = learner.parallel_mlp(shard["x"], shard["w1"], shard["b1"], shard["w2"], shard["b2"])
    with dist_probes.scope("tp backward"):
        y.backward(weights["dy"].to(device))
    return {"y": _cpu(y), **{k: (_cpu(v.grad) if v.grad is not None else torch.full(v.shape, float("nan")))
                             for k, v in shard.items()}}


def _two_stage(learner, seed: int, microbatches: int, device: str) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    weights = two_stage_weights(seed)
    w = weights[f"w{rank}"].to(device).clone().requires_grad_()
    b = weights[f"b{rank}"].to(device).clone().requires_grad_()
    data = (weights["x"] if rank == 0 else weights["target"]).to(device)
    with dist_probes.scope("two stage"):  # the messages between the stages: one each way per microbatch
        loss = learner.two_stage_step(w, b, data, microbatches)
    return {"loss": None if loss is None else torch.as_tensor(loss, dtype=torch.float64).detach().cpu().clone(),
            "grad_w": _cpu(w.grad), "grad_b": _cpu(b.grad)}


def _moe(learner, seed: int, top_k: int, capacity: int, device: str) -> dict:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    weights = moe_weights(seed, world)
    per_rank = weights["router"].shape[1] // world
    local = range(rank * per_rank, (rank + 1) * per_rank)
    experts = [Expert(weights["w_in"][e].to(device), weights["w_out"][e].to(device)) for e in local]
    out, dropped = learner.moe_layer(weights["x"][rank].to(device).clone(), weights["router"].to(device).clone(),
                                     experts, top_k, capacity)
    return {"out": _cpu(out).clone(), "dropped": int(dropped), "expert_rows": [e.rows for e in experts]}


def grade_rank(seed: int, microbatches: int, top_k: int, capacity: int) -> dict:
    """Week 14's distributed experiments in this rank, each around the learner's function."""
    import importlib

    torch.set_num_threads(1)
    device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    results: dict = {}
    try:
        tp = importlib.import_module("tensor_parallel")
        _attempt(results, "tensor_parallel", lambda: _tensor_parallel(tp, seed, device))
    except Exception as exc:
        results["tensor_parallel"] = {"error": "".join(traceback.format_exception_only(type(exc), exc))}
    try:
        pp = importlib.import_module("pipeline")
        _attempt(results, "two_stage", lambda: _two_stage(pp, seed, microbatches, device))
    except Exception as exc:
        results["two_stage"] = {"error": "".join(traceback.format_exception_only(type(exc), exc))}
    try:
        moe = importlib.import_module("moe")
        _attempt(results, "moe", lambda: _moe(moe, seed, top_k, capacity, device))
    except Exception as exc:
        results["moe"] = {"error": "".join(traceback.format_exception_only(type(exc), exc))}
    return results
