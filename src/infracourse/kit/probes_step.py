"""A learner's week-6 train_step driven inside the grading worker, on a model and optimiser built there.

train_step(model, optimizer, inputs, targets, metrics) works on live objects, which cannot cross to the judge,
so the judge builds a `TrainSteps` in the worker (`WorkerClient.build(BuildInWorker(...))`) from the kit's config and
its own model's weights, feeds it batches, and reads back plain results: the weights after the steps, the
metrics, and what torch.profiler saw in one step. Everything it reports is evidence from a process learner
code ran in: the judge compares weights and metrics with the provided step it runs itself.
"""
from __future__ import annotations

from typing import Callable

import torch

from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.train import slow_train_step

SYNC_OP = "aten::_local_scalar_dense"  # what .item(), float(t) and bool(t) run: the host waits for the value
# what a GPU profile shows when the host waits for the device or copies a value back to it
DEVICE_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "Memcpy DtoH")
HOST_READ_METHODS = frozenset({"item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__",
                               "__complex__", "__repr__", "__str__", "__format__"})


class _HostReads(torch.overrides.TorchFunctionMode):
    """Counts tensor methods that hand a tensor's values to Python (and .cpu()/.to() of a device tensor)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        on_device = isinstance(first, torch.Tensor) and first.device.type != "cpu"
        if name in HOST_READ_METHODS or (name in ("cpu", "to") and on_device and _to_host(name, args, kwargs or {})):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _to_host(name: str, args, kwargs) -> bool:
    """A .cpu(), or a .to() whose target device is the host."""
    if name == "cpu":
        return True
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"


class TrainSteps:
    """A kit GPT with the judge's weights and an AdamW, stepped by `train_step` (None: the provided step)."""

    def __init__(self, train_step: Callable | None, cfg: GPTConfig, weights: dict, device: str = "cpu",
                 lr: float = 1e-3):
        self.step_fn = train_step or slow_train_step
        self.model = GPT(cfg).to(device)
        self.model.load_state_dict(weights)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.metrics: dict = {}

    def step(self, inputs, targets) -> None:
        self.step_fn(self.model, self.optimizer, inputs, targets, self.metrics)

    def steps(self, batches) -> int:
        """Run one step per (inputs, targets) of `batches`; returns how many steps the metrics counted."""
        before = self.metrics.get("steps", 0)
        for inputs, targets in batches:
            self.step(inputs, targets)
        return int(self.metrics.get("steps", 0)) - int(before)

    def state(self) -> dict:
        """The weights after the steps, and the metrics with any tensor read as a float."""
        metrics = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in self.metrics.items()
                   if isinstance(k, str)}
        return {"weights": {k: v.detach().cpu() for k, v in self.model.named_parameters()}, "metrics": metrics}

    def trace(self, inputs, targets, precision: str, path: str) -> None:
        """One step under torch.profiler (record_shapes=True; autocast to bf16 when `precision` is "bf16"),
        exported with export_chrome_trace(path): the profile a learner's trace file is held against."""
        from torch.profiler import ProfilerActivity, profile

        device = next(self.model.parameters()).device.type
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities, record_shapes=True) as prof:
            with torch.autocast(device, torch.bfloat16, enabled=precision == "bf16"):
                self.step(inputs, targets)
        prof.export_chrome_trace(str(path))

    def profile(self, inputs, targets, bare: bool = False) -> dict:
        """One step watched by three observers: the torch profiler (calls of the sync op; bytes each op
        allocated, self, CPU plus device; on a GPU, device-to-host copies and the runtime's waits), a
        TorchFunctionMode (host reads at the Python level: .item(), .tolist(), .numpy(), float(t), bool(t),
        printing, .cpu() of a device tensor) and tracemalloc (bytes allocated outside torch, NumPy's
        included). `bare`: forward, backward and optimizer.step() alone, the floor a step is held against."""
        import tracemalloc

        from torch.profiler import ProfilerActivity, profile

        device = next(self.model.parameters()).device.type
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        reads = _HostReads()
        tracemalloc.start()
        try:
            with profile(activities=activities, profile_memory=True) as prof, reads:
                if bare:
                    self.model(inputs, targets)[1].backward()
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                else:
                    self.step(inputs, targets)
            python_bytes = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        allocated, syncs, waits = {}, 0, 0
        for event in prof.events():
            syncs += event.name == SYNC_OP
            waits += event.name.startswith(DEVICE_WAITS)
            grown = max(event.self_cpu_memory_usage, 0) + max(getattr(event, "self_device_memory_usage", 0), 0)
            allocated[event.name] = allocated.get(event.name, 0) + grown
        return {"syncs": syncs, "host_reads": reads.count, "device_waits": waits, "allocated": allocated,
                "python_bytes": int(python_bytes)}


FORWARD_ONLY_OPS = frozenset({"aten::linear", "aten::gelu", "aten::scaled_dot_product_attention"})


def checkpoint_evidence(loss_fn: Callable | None, cfg: GPTConfig, weights: dict, inputs, targets,
                        repeats: int = 5) -> dict:
    """`loss_fn(model, inputs, targets)` (None: the kit's plain `model(inputs, targets)[1]`) on a fresh kit GPT
    with `weights`: the bytes the forward pass leaves allocated (torch.profiler's memory records: every
    allocation less every free, whoever holds the tensors), the forward ops run again during backward
    (recomputation), the loss, every gradient, and the fastest of `repeats` forward+backward times."""
    import time

    from torch.profiler import ProfilerActivity, profile

    model = GPT(cfg)
    model.load_state_dict(weights)
    call = (lambda: loss_fn(model, inputs, targets)) if loss_fn is not None else \
        (lambda: model(inputs, targets)[1])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = call()
    retained = sum(event.self_cpu_memory_usage for event in prof.events())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss.backward()
    recomputed = sum(event.name in FORWARD_ONLY_OPS for event in prof.events())
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        call().backward()
        best = min(best, time.perf_counter() - start)
    return {"loss": loss.detach(), "retained": int(retained), "recomputed": int(recomputed), "grads": grads,
            "seconds": best}
