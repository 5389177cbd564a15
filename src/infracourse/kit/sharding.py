"""Course references for week 13 (ZeRO and FSDP): exact per-device memory accounting, the unsharded AdamW run the
sharded ones must equal, and the in-rank measurements the grader relies on.

Memory convention (the handout states it; the judge's formula is graders/week13/week13_judging.py, out of
learner code's reach):
  P parameters, N devices (world), stage 0 (plain data parallelism), 1 (optimiser states sharded), 2 (+ gradients),
  3 (+ parameters). A sharded quantity is split over a flat buffer padded to N * ceil(P / N) elements, so every
  device holds ceil(P / N) elements of it; an unsharded one holds all P.
  precision "fp32": parameters 4 B, gradients 4 B, optimiser 8 B per element (AdamW's exp_avg and exp_avg_sq).
  precision "bf16-mixed": bf16 parameters 2 B and gradients 2 B; optimiser 12 B per element (fp32 master weights
  4 B + exp_avg 4 B + exp_avg_sq 4 B), the master weights being part of the sharded optimiser state.

In-rank entry point: `rank_main` (called by kit.rank_driver under torchrun) runs the week's experiments with the
learner's modules and returns plain tensors and numbers; what it measures inside the rank is evidence the judge
weighs against its own single-process references (graders/week13/week13_judging.py: the unsharded AdamW run and
the plain forward, kept out of the ranks' reach, where a Zero1AdamW could copy them in).
"""
from __future__ import annotations

import gc
import importlib
import os
import resource
import threading
import time
import traceback
import types

import torch
from torch import nn

PRECISIONS = {"fp32": (4, 4, 8), "bf16-mixed": (2, 2, 12)}  # bytes per element: params, grads, optimiser
STAGES = (0, 1, 2, 3)

# the ZeRO-1 / FSDP workload: same model, data and AdamW hyper-parameters for every configuration
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.99), 1e-8, 0.1
ZERO_STEPS, FSDP_STEPS, PER_RANK_BATCH = 10, 4, 4
WIDTH, DEPTH, OUT = 16, 6, 5


# ----------------------------------------------------------------------------------------------- the workload
def make_model(seed: int) -> nn.Sequential:
    """DEPTH Linear(16, 16) + GELU layers and a Linear(16, 5) head: 1,717 parameters, odd and not a multiple of
    3, so shards over 2 and 3 ranks are uneven."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    layers.append(nn.Linear(WIDTH, OUT))
    return nn.Sequential(*layers)


def global_batch(seed: int, step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s global batch (world * PER_RANK_BATCH rows); rank r trains on rows r*B:(r+1)*B."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    rows = world * PER_RANK_BATCH
    return torch.randn(rows, WIDTH, generator=g), torch.randn(rows, OUT, generator=g)


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (model(x) - y).pow(2).mean()


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def unsharded_state_bytes(model: nn.Module) -> int:
    """AdamW's exp_avg and exp_avg_sq in fp32 for every parameter (step counters left out)."""
    return 2 * 4 * sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- activation checkpointing workload
class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.act, self.down = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


class BlockStack(nn.Module):
    """model.blocks (a ModuleList of residual MLP blocks), then model.head; forward is the plain reference."""

    def __init__(self, d: int = 32, depth: int = 4, out: int = 8):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, out)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def checkpoint_inputs(seed: int) -> tuple[BlockStack, torch.Tensor]:
    torch.manual_seed(seed + 13)
    model = BlockStack()
    return model, torch.randn(64, 32)


def saved_bytes(forward, model: nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor, dict[str, torch.Tensor]]:
    """Bytes of the distinct storages autograd saves for backward during `forward(model, x)` (counted by the
    course's saved_tensors_hooks; the model's own parameters left out), then the output and the gradients of a
    fixed loss."""
    seen: dict[int, int] = {}
    held: list[torch.Tensor] = []  # every packed tensor kept alive until counted: a freed storage's address
    #                                could be handed to the next allocation and be counted once for two

    weights = _storages(model.parameters())  # the parameters autograd saves are not activations

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() in weights:
            return t
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        held.append(t.detach())
        return t

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(model, x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the forward returned {type(out).__name__}, expected a tensor")
    held.clear()
    out.square().mean().backward()
    grads = {n: p.grad.detach().clone() if p.grad is not None else torch.full_like(p, float("nan"))
             for n, p in model.named_parameters()}
    return sum(seen.values()), out.detach(), grads


# ------------------------------------------------------------------------------ the in-rank measurement of state
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.CodeType, types.FrameType,
           types.MethodWrapperType, types.WrapperDescriptorType)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def held_tensor_bytes(roots: list, skip_storages: set[int], own_modules: tuple[str, ...] = (),
                      limit: int = 200_000) -> int:
    """Bytes of the distinct tensor storages reachable from `roots` (through attributes, containers, bound
    methods, closures, and the classes of `own_modules`; not through modules, other classes or a function's
    globals), leaving out `skip_storages`."""
    stack, visited, found = list(roots), set(), {}
    while stack and len(visited) < limit:
        obj = stack.pop()
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if storage.nbytes() and key not in skip_storages:
                found[key] = max(found.get(key, 0), storage.nbytes())
            if obj.grad is not None:
                stack.append(obj.grad)
            continue
        if isinstance(obj, types.FunctionType):  # a closure's cells and defaults, not the module it came from
            stack.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
            stack.extend((obj.__defaults__ or ()) + tuple((obj.__kwdefaults__ or {}).values()))
            continue
        if isinstance(obj, type):  # class attributes of the learner's own classes, not torch's
            if obj.__module__ in own_modules:
                stack.extend(vars(obj).values())
            continue
        if isinstance(obj, _OPAQUE):
            continue
        stack.extend(gc.get_referents(obj))
    return sum(found.values())


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t is not None}


# --------------------------------------------------------------- the in-rank clock of communication (a probe)
# The collectives ZeRO-1 and FSDP2 call from Python (FSDP2 through all_gather_single / reduce_scatter_single),
# wrapped before the learner's import (install(), run by kit.rank_driver as this week's probe): the time spent
# inside each outermost call plus the time spent waiting on an asynchronous one's Work, and its payload: the
# collective's full buffer, the largest tensor argument (an all-gather's output, a reduce-scatter's input, an
# all-reduce's tensor; a list counts its sum). Evidence, like every probe: the verdict rests on the parameters.
COMM_OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
            "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
            "_reduce_scatter_base", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
            "isend", "irecv", "barrier")
COMM = {"s": 0.0, "bytes": 0, "calls": 0}
_inside = threading.local()


def _payload(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_payload(v) for v in value)
    return 0


def _timed(fn):
    def timed(*args, **kwargs):
        if getattr(_inside, "depth", 0):
            return fn(*args, **kwargs)
        _inside.depth = 1
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            COMM["s"] += time.perf_counter() - started
            COMM["calls"] += 1
            COMM["bytes"] += max([_payload(a) for a in (*args, *kwargs.values())] or [0])
            _inside.depth = 0

    timed.__infracourse_sharding__ = True
    return timed


def install() -> None:
    """Time the collectives (and waits on their Work) in this rank; idempotent."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COMM_OPS:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "__infracourse_sharding__", False):
            continue
        wrapped = _timed(original)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)
    wait = dist.Work.wait
    if not getattr(wait, "__infracourse_sharding__", False):
        def timed_wait(self, *args, **kwargs):
            if getattr(_inside, "depth", 0):
                return wait(self, *args, **kwargs)
            started = time.perf_counter()
            try:
                return wait(self, *args, **kwargs)
            finally:
                COMM["s"] += time.perf_counter() - started

        timed_wait.__infracourse_sharding__ = True
        dist.Work.wait = timed_wait


def report() -> dict:
    return {"installed": True}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """The course's clock of each training step (forward, backward, optimiser step) and of the communication
    inside it, read before and after: per step its seconds, seconds inside collectives and payload bytes."""

    def __init__(self, device: torch.device):
        self.device, self.steps = device, []

    def __enter__(self):
        _sync(self.device)
        self.started, self.comm = time.perf_counter(), dict(COMM)
        return self

    def __exit__(self, *exc):
        _sync(self.device)
        self.steps.append({"s": time.perf_counter() - self.started, "comm_s": COMM["s"] - self.comm["s"],
                           "comm_bytes": COMM["bytes"] - self.comm["bytes"],
                           "comm_calls": COMM["calls"] - self.comm["calls"]})
        return False


def peak_memory_mb() -> float:
    """This rank's peak memory: the CUDA allocator's high-water mark on a GPU, the process's ru_maxrss on the CPU."""
    if os.environ.get("INFRACOURSE_DEVICE") == "cuda":
        return torch.cuda.max_memory_allocated() / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# -------------------------------------------------------------------------------------------- the experiments
def _device() -> torch.device:
    """This rank's device: its GPU under NCCL (kit.rank_driver set it current), else the CPU."""
    import os

    return torch.device("cuda", torch.cuda.current_device()) if os.environ.get("INFRACOURSE_DEVICE") == "cuda" \
        else torch.device("cpu")


def _zero1(seed: int, module: str) -> dict:
    import torch.distributed as dist

    rank, world, device = dist.get_rank(), dist.get_world_size(), _device()
    learner = importlib.import_module(module)
    model = make_model(seed).to(device)
    params = list(model.parameters())
    opt = learner.Zero1AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    if type(opt).__module__.startswith("torch."):
        raise TypeError("Zero1AdamW must be your own wrapper, not torch's optimiser classes")
    state_bytes, clock = None, StepClock(device)
    for step in range(ZERO_STEPS):
        x, y = global_batch(seed, step, world)
        rows = slice(rank * PER_RANK_BATCH, (rank + 1) * PER_RANK_BATCH)
        x, y = x[rows].to(device), y[rows].to(device)
        with clock:
            loss_fn(model, x, y).backward()
            opt.step()
        if step == ZERO_STEPS - 1:  # what the optimiser keeps, besides the model's own parameters and gradients
            skip = _storages(params) | _storages(p.grad for p in params)
            state_bytes = held_tensor_bytes([opt, vars(learner)], skip, own_modules=(learner.__name__,))
        opt.zero_grad()
    return {"params": flat_params(model).cpu(), "state_bytes": state_bytes, "world": world, "steps": clock.steps}


def _fsdp(seed: int, module: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    rank, world, device = dist.get_rank(), dist.get_world_size(), _device()
    learner = importlib.import_module(module)
    model = make_model(seed).to(device)
    numel = sum(p.numel() for p in model.parameters())
    sharded = learner.shard_model(model)
    if sharded is None:
        sharded = model
    roots = [m for m in sharded.modules() if isinstance(m, FSDPModule)]
    linears, in_units = _linears_in_units(sharded, FSDPModule)
    local = 0
    for p in sharded.parameters():
        local += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    opt = torch.optim.AdamW(sharded.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    clock = StepClock(device)
    for step in range(FSDP_STEPS):
        x, y = global_batch(seed, step, world)
        rows = slice(rank * PER_RANK_BATCH, (rank + 1) * PER_RANK_BATCH)
        x, y = x[rows].to(device), y[rows].to(device)
        with clock:
            loss_fn(sharded, x, y).backward()
            opt.step()
        if step == FSDP_STEPS - 1:  # what this rank holds of the training state, read here, not from the learner
            held = {"params": _local_bytes(sharded.parameters()),
                    "grads": _local_bytes(p.grad for p in sharded.parameters() if p.grad is not None),
                    "optimizer": _local_bytes(t for state in opt.state.values() for t in state.values()
                                              if isinstance(t, torch.Tensor) and t.dim() > 0)}
        opt.zero_grad(set_to_none=True)
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in sharded.parameters()]
    return {"params": torch.cat([t.detach().reshape(-1) for t in full]).cpu(), "local_numel": local, "numel": numel,
            "fsdp_modules": len(roots), "linears": linears, "linears_in_units": in_units, "held_bytes": held,
            "world": world, "steps": clock.steps}


def _local_bytes(tensors) -> int:
    """Bytes of the local shards of `tensors` (a DTensor's to_local(), a plain tensor whole)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _linears_in_units(root: nn.Module, fsdp_type: type) -> tuple[list[str], list[str]]:
    """The Linear layers of `root`, and those whose parameters an FSDP unit below the root owns (the layer
    itself or a module between it and the root wrapped by fully_shard): only those are gathered just before they
    run and freed after; a layer owned by the root is gathered with the whole model at the start of forward."""
    linears, in_units = [], []
    for name, module in root.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        linears.append(name)
        parts = name.split(".")
        owners = [root.get_submodule(".".join(parts[:i])) for i in range(1, len(parts) + 1)]
        if any(isinstance(m, fsdp_type) for m in owners):
            in_units.append(name)
    return linears, in_units


def _checkpoint(seed: int, module: str) -> dict:
    learner = importlib.import_module(module)
    model, x = checkpoint_inputs(seed)
    plain, _, _ = saved_bytes(lambda m, t: m(t), model, x)
    nbytes, out, grads = saved_bytes(learner.checkpointed_forward, model, x)
    return {"plain_bytes": plain, "bytes": nbytes, "out": out, "grads": grads}


EXPERIMENTS = {"zero1": _zero1, "fsdp": _fsdp, "checkpoint": _checkpoint}


def rank_main(experiments: dict[str, str], seed: int) -> dict:
    """Each experiment (name -> the learner's module) in turn; a learner failure is kept as that experiment's
    traceback tail so the other experiments still report."""
    results = {}
    for name, module in experiments.items():
        try:
            results[name] = EXPERIMENTS[name](seed, module)
        except Exception as exc:
            tail = traceback.format_exception(type(exc), exc, exc.__traceback__)
            results[name] = {"error": "".join(tail)[-2500:]}
    results["peak_memory_mb"] = peak_memory_mb()
    return results


def main() -> None:
    """`torchrun --nproc-per-node 2 -m infracourse.kit.sharding` in your lab folder: the grader's ZeRO-1 and FSDP2
    experiments on your modules, with the same clocks; rank 0 prints what your report's figures ask for."""
    import sys

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    install()
    sys.path.insert(0, os.getcwd())
    out = rank_main({"zero1": "zero1", "fsdp": "fsdp"}, seed=0)
    if dist.get_rank() == 0:
        for name in ("zero1", "fsdp"):
            if "error" in out[name]:
                print(f"{name} failed:\n{out[name]['error']}")
                continue
            timed = out[name]["steps"][1:]
            total, comm = sum(t["s"] for t in timed), sum(t["comm_s"] for t in timed)
            print(f"{name}: median step {1e3 * sorted(t['s'] for t in timed)[len(timed) // 2]:.3f} ms, "
                  f"communication share {comm / total:.3f}, {timed[0]['comm_bytes']} B in "
                  f"{timed[0]['comm_calls']} collective calls per step")
        if "held_bytes" in out["fsdp"]:
            held = out["fsdp"]["held_bytes"]
            print(f"fsdp: rank 0 holds {sum(held.values())} B of training state ({held}), "
                  f"{len(out['fsdp']['linears_in_units'])} of {len(out['fsdp']['linears'])} Linear layers in "
                  "their own FSDP unit")
        print(f"peak memory of rank 0: {out['peak_memory_mb']:.0f} MiB (the process's resident size on a CPU: "
              "the same with or without sharding at this model's size)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
