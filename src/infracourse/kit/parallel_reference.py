"""Week 14 course code: dense references for tensor, pipeline and expert parallelism, the schedule rules, and
the elastic run's single-process reference. The judge computes every reference here, in its own process; the
function `grade_rank` runs in each torchrun rank around the learner's code (evidence only).

Reading order: tensor-parallel MLP -> pipeline schedules and the 2-stage model -> mixture of experts ->
elastic training -> what each rank runs.
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


def dense_mlp(x, w1, b1, w2, b2):
    return F.gelu(x @ w1.T + b1) @ w2.T + b2


def dense_mlp_grads(weights: dict) -> dict:
    """y and the gradients of x, w1, b1, w2, b2 for the upstream gradient dy (float64)."""
    leaves = {k: weights[k].clone().requires_grad_() for k in ("x", "w1", "b1", "w2", "b2")}
    y = dense_mlp(**leaves)
    y.backward(weights["dy"])
    return {"y": y.detach(), **{k: v.grad for k, v in leaves.items()}}


def mlp_shard(weights: dict, rank: int, world: int) -> dict:
    """Megatron's split: w1 and b1 by output rows (column-parallel), w2 by input columns (row-parallel); x and
    b2 whole on every rank."""
    rows = weights["w1"].shape[0] // world
    part = slice(rank * rows, (rank + 1) * rows)
    return {"x": weights["x"], "w1": weights["w1"][part], "b1": weights["b1"][part], "w2": weights["w2"][:, part],
            "b2": weights["b2"]}


# ------------------------------------------------------------------------------------------------ pipeline
def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle share of a synchronous schedule with equal forward and backward times: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def check_schedule(schedule, stages: int, microbatches: int, max_in_flight: int | None = None) -> dict:
    """The judge's reading of a schedule: a list of time steps, each a list of (stage, microbatch, 'F'|'B'),
    every action one time unit. Returns {'errors': [...], 'bubble': idle share, 'in_flight': per-stage peak}."""
    errors: list[str] = []
    done: dict[tuple, int] = {}
    in_flight, peak = [0] * stages, [0] * stages
    if not isinstance(schedule, (list, tuple)):
        return {"errors": [f"the schedule is a {type(schedule).__name__}, not a list of time steps"],
                "bubble": None, "in_flight": peak}
    for t, step in enumerate(schedule):
        busy = set()
        if not isinstance(step, (list, tuple)):
            errors.append(f"time step {t} is {step!r}, not a list of (stage, microbatch, 'F'|'B')")
            continue
        for action in step:
            if not (isinstance(action, (list, tuple)) and len(action) == 3 and action[2] in ("F", "B")
                    and all(isinstance(v, int) for v in action[:2])):
                errors.append(f"time step {t}: {action!r} is not (stage, microbatch, 'F'|'B')")
                continue
            s, m, kind = action
            if not (0 <= s < stages and 0 <= m < microbatches):
                errors.append(f"time step {t}: {action!r} names a stage or microbatch outside {stages}x"
                              f"{microbatches}")
                continue
            if s in busy:
                errors.append(f"time step {t}: stage {s} does two things at once")
            busy.add(s)
            if (s, m, kind) in done:
                errors.append(f"{(s, m, kind)} runs twice (time steps {done[(s, m, kind)]} and {t})")
                continue
            needs = ([(s - 1, m, "F")] if kind == "F" and s > 0 else
                     [(s, m, "F")] + ([(s + 1, m, "B")] if s < stages - 1 else []) if kind == "B" else [])
            for need in needs:
                if done.get(need, t) >= t:
                    errors.append(f"time step {t}: {(s, m, kind)} runs before {need} has finished")
            done[(s, m, kind)] = t
            in_flight[s] += 1 if kind == "F" else -1
            peak[s] = max(peak[s], in_flight[s])
    missing = [(s, m, k) for s in range(stages) for m in range(microbatches) for k in "FB" if (s, m, k) not in done]
    if missing:
        errors.append(f"{len(missing)} actions never run, e.g. {missing[:3]}")
    if max_in_flight is not None:
        over = [s for s in range(stages) if peak[s] > max_in_flight]
        if over:
            errors.append(f"stage {over[0]} holds {peak[over[0]]} microbatches' activations at once; 1F1B holds "
                          f"at most {max_in_flight} (the number of stages)")
    length = len(schedule)
    bubble = 1 - 2 * microbatches / length if length else None
    return {"errors": errors, "bubble": bubble, "in_flight": peak, "length": length}


def two_stage_weights(seed: int, batch: int = 8, d_in: int = 6, hidden: int = 10, d_out: int = 4) -> dict:
    """Stage 0: h = tanh(x @ w0.T + b0); stage 1: out = h @ w1.T + b1; loss = mean squared error over the whole
    batch (float64)."""
    g = torch.Generator().manual_seed(seed + 1)
    r = lambda *shape, s=1.0: torch.randn(*shape, generator=g, dtype=torch.float64) * s  # noqa: E731
    return {"x": r(batch, d_in), "target": r(batch, d_out), "w0": r(hidden, d_in, s=0.4), "b0": r(hidden, s=0.1),
            "w1": r(d_out, hidden, s=0.4), "b1": r(d_out, s=0.1)}


def two_stage_reference(weights: dict) -> dict:
    """The whole batch in one process: loss and the gradient of each stage's parameters."""
    p = {k: weights[k].clone().requires_grad_() for k in ("w0", "b0", "w1", "b1")}
    out = torch.tanh(weights["x"] @ p["w0"].T + p["b0"]) @ p["w1"].T + p["b1"]
    loss = F.mse_loss(out, weights["target"])
    loss.backward()
    return {"loss": loss.detach(), **{k: v.grad for k, v in p.items()}}


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


def moe_route(x: torch.Tensor, router: torch.Tensor, top_k: int):
    """Top-k gating: the k best experts of each token and their softmax weights renormalised over those k."""
    probs = torch.softmax(x @ router, dim=-1)
    gate, expert = probs.topk(top_k, dim=-1)
    return expert, gate / gate.sum(-1, keepdim=True)


def overflowing_capacity(weights: dict, top_k: int) -> int:
    """A per-expert capacity under which every rank drops at least one assignment: one below the smallest, over
    ranks, of a rank's busiest expert's count. A fixed capacity let some seeds drop nothing, and a layer that
    never counted its drops passed them."""
    world, experts = weights["x"].shape[0], weights["router"].shape[1]
    busiest = []
    for rank in range(world):
        expert, _ = moe_route(weights["x"][rank], weights["router"], top_k)
        busiest.append(int(torch.bincount(expert.reshape(-1), minlength=experts).max()))
    return max(1, min(busiest) - 1)


def dense_moe(weights: dict, top_k: int, capacity: int) -> dict:
    """Every rank's output without any communication. Capacity: each rank sends at most `capacity` tokens to
    each expert, the first ones in token order; an assignment past it is dropped (contributes nothing)."""
    world, tokens, _ = weights["x"].shape
    experts = weights["router"].shape[1]
    outs, dropped, rows = [], [], [0] * experts
    for rank in range(world):
        x = weights["x"][rank]
        expert, gate = moe_route(x, weights["router"], top_k)
        out, sent, lost = torch.zeros_like(x), [0] * experts, 0
        for t in range(tokens):
            for j in range(top_k):
                e = int(expert[t, j])
                if sent[e] >= capacity:
                    lost += 1
                    continue
                sent[e] += 1
                rows[e] += 1
                out[t] += gate[t, j] * (F.gelu(x[t] @ weights["w_in"][e]) @ weights["w_out"][e])
        outs.append(out)
        dropped.append(lost)
    return {"out": torch.stack(outs), "dropped": dropped, "expert_rows": rows}


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


def elastic_reference(seed: int, steps: int, world: int) -> dict[str, torch.Tensor]:
    """The uninterrupted data-parallel run in one process: per step, each rank's gradient, averaged, then SGD
    with momentum (torch.optim.SGD)."""
    params = {k: v.clone().requires_grad_() for k, v in elastic_params(seed).items()}
    opt = torch.optim.SGD(params.values(), lr=ELASTIC["lr"], momentum=ELASTIC["momentum"])
    for step in range(1, steps + 1):
        grads = []
        for rank in range(world):
            grads.append(torch.autograd.grad(elastic_loss(params, *elastic_batch(seed, step, rank)),
                                             list(params.values())))
        for p, *gs in zip(params.values(), *grads):
            p.grad = sum(gs[1:], gs[0]) / world
        opt.step()
    return {k: v.detach() for k, v in params.items()}


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
