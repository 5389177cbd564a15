"""Course code the judge runs inside the grading worker, next to a learner's autograd objects.

The judge never holds the learner's modules or graphs, only proxies (grading.remote); these probes are built
in the worker with `WorkerClient.build(BuildInWorker("infracourse.kit.probes_autograd:...", (handle, ...)))` and
report plain facts back. What they report is evidence from a process learner code ran in: the judge still
checks values and gradients against its own computation.
"""
from __future__ import annotations

from typing import Any


def grad_fn_origin(fn, function_cls, *args) -> dict:
    """Call fn(*args) and say which autograd node made its output: {'grad_fn': name, 'own': bool}, where
    `own` is True when that node is the backward of `function_cls` (a torch.autograd.Function)."""
    out = fn(*args)
    node = getattr(out, "grad_fn", None)
    return {"grad_fn": type(node).__name__ if node is not None else "None",
            "own": node is not None and getattr(node, "_forward_cls", None) is function_cls}


class Functional:
    """A learner's nn.Module called with parameters passed in: `probe(x, *params)` runs the module's forward
    with `params` (in the order of `names`) standing in for its own, so they are inputs of the call and the
    judge's bridged autograd gets their gradients back."""

    def __init__(self, module):
        self.module = module
        self.names = [name for name, _ in module.named_parameters()]

    def __call__(self, x, *params) -> Any:
        from torch.func import functional_call

        return functional_call(self.module, dict(zip(self.names, params)), (x,))


def backward_evidence(fn, function_cls, x, weight, eps) -> dict:
    """Run fn(x, weight, eps).backward() watched two ways, and say what the backward pass did besides the
    Function's own node: {'own': the output's node is function_cls's, 'others': autograd nodes the engine
    evaluated other than that node and AccumulateGrad (profiler), 'saved': tensors saved for a backward
    while it ran (saved_tensors_hooks: a backward that builds a graph of its own saves some), 'error': what
    the backward raised under the hooks, 'grads': (dx, dweight)}. A hand-written backward evaluates no other
    node and saves nothing."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    out = fn(x, weight, eps)
    node = getattr(out, "grad_fn", None)
    own = node is not None and getattr(node, "_forward_cls", None) is function_cls
    saved, error = [0], None

    def pack(t):
        saved[0] += 1
        return t

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out.backward(torch.ones_like(out))
        except RuntimeError as exc:  # e.g. torch.func refuses to run under saved-tensor hooks
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
    prefix, mine = "autograd::engine::evaluate_function: ", type(node).__name__
    others = sorted({e.name[len(prefix):] for e in prof.events() if e.name.startswith(prefix)}
                    - {mine, "torch::autograd::AccumulateGrad"})
    return {"own": own, "others": others, "saved": saved[0], "error": error,
            "grads": (x.grad, weight.grad)}


def norm_nodes(module, function_cls, x) -> dict:
    """Call module(x) and say whether function_cls's backward is in the output's autograd graph (anywhere:
    casts may wrap it): {'through': bool, 'nodes': the graph's node names, at most 30}."""
    x = x.detach().requires_grad_()
    out = module(x)
    seen, stack, names, through = set(), [getattr(out, "grad_fn", None)], [], False
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names.append(type(node).__name__)
        through = through or getattr(node, "_forward_cls", None) is function_cls
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return {"through": through, "nodes": sorted(set(names))[:30]}
