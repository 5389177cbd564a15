"""Week 14's references, computed by the judge in its own process: the dense tensor-parallel MLP and its
gradients, the schedule rules and the bubble, the 2-stage model's whole-batch gradients, the dense mixture of
experts with its drops, and the uninterrupted elastic run. They live here, beside the graders, because the
sandbox never mounts this folder: in kit.parallel_reference, which the ranks and the worker import, a
learner's pipeline.py could have returned the judge's own bubble, or elastic_train.py the judge's final
parameters. The inputs they take are the kit's (the same seed, the same tensors the ranks were given)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from infracourse.kit.parallel_reference import (ELASTIC, elastic_batch, elastic_loss, elastic_params,  # noqa: F401
                                                mlp_shard, mlp_weights, moe_weights, two_stage_weights)


def dense_mlp(x, w1, b1, w2, b2):
    return F.gelu(x @ w1.T + b1) @ w2.T + b2


def dense_mlp_grads(weights: dict) -> dict:
    """y and the gradients of x, w1, b1, w2, b2 for the upstream gradient dy (float64)."""
    leaves = {k: weights[k].clone().requires_grad_() for k in ("x", "w1", "b1", "w2", "b2")}
    y = dense_mlp(**leaves)
    y.backward(weights["dy"])
    return {"y": y.detach(), **{k: v.grad for k, v in leaves.items()}}



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



def two_stage_reference(weights: dict) -> dict:
    """The whole batch in one process: loss and the gradient of each stage's parameters."""
    p = {k: weights[k].clone().requires_grad_() for k in ("w0", "b0", "w1", "b1")}
    out = torch.tanh(weights["x"] @ p["w0"].T + p["b0"]) @ p["w1"].T + p["b1"]
    loss = F.mse_loss(out, weights["target"])
    loss.backward()
    return {"loss": loss.detach(), **{k: v.grad for k, v in p.items()}}



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
