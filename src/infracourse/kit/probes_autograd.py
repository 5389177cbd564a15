"""Course code the judge runs inside the grading worker, next to a learner's autograd objects.

The judge never holds the learner's modules or graphs, only proxies (grading.remote); these probes are built
in the worker with `Worker.build(WorkerObject("infracourse.kit.probes_autograd:...", (handle, ...)))` and
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
