"""Week 12's course pieces: the dataset, model and optimiser every run uses, the single-process reference run
with the global batch, the FLOP count and CPU peak for MFU, and the course code that runs inside each rank.

Reading order: data -> model -> optimiser -> reference run -> FLOPs and peak -> in-rank probe and driver.

Why a DistributedDataParallel run can be compared with one process: the sampler (shuffle, seed, `set_epoch`)
deals epoch e's permutation round-robin, rank r taking positions r, r + W, r + 2W, ...; each rank cuts its
share into per-rank batches b and accumulates A of them per optimiser step. Step j of the epoch therefore
covers positions [j*G, (j+1)*G) of the permutation, G = b * A * W, on every world size, and the mean loss over
those equal-sized pieces is the mean over the G samples: one process taking batch G from the same permutation
takes the same step (up to float summation order).
"""
from __future__ import annotations

import collections
import importlib
import os
import resource
import time
import traceback

import torch
from torch import nn

IN_FEATURES, HIDDEN, OUT_FEATURES = 32, 256, 8
LR, MOMENTUM = 0.05, 0.9


# --- data: a seeded regression set whose items carry their own index --------------------------------------
class IndexedDataset(torch.utils.data.Dataset):
    """(x, y, index) per sample, so a run can say which samples it consumed."""

    def __init__(self, samples: int, seed: int = 0):
        gen = torch.Generator().manual_seed(1000 + seed)
        self.x = torch.randn(samples, IN_FEATURES, generator=gen)
        teacher = torch.randn(IN_FEATURES, OUT_FEATURES, generator=gen) / IN_FEATURES ** 0.5
        self.y = torch.tanh(self.x @ teacher) + 0.1 * torch.randn(samples, OUT_FEATURES, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def make_dataset(samples: int, seed: int = 0) -> IndexedDataset:
    return IndexedDataset(samples, seed)


# --- model, loss, optimiser ----------------------------------------------------------------------------
def make_model(seed: int = 0) -> nn.Sequential:
    """The MLP every rank starts from: the same weights from the same seed, without touching global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                             nn.Linear(HIDDEN, OUT_FEATURES))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error, a MEAN over the batch: the gradient of a global batch is the mean of its pieces'."""
    return nn.functional.mse_loss(output, target)


STEP_CLOCK: list[float] = []  # perf_counter at the end of every optimiser step in this process (course clock)
# What happened in this process, in the order it happened: ("grad", t) a parameter's gradient was accumulated,
# ("bucket", t) DDP launched a bucket's all-reduce (the course's comm hook), ("allreduce", t) the code called
# torch.distributed.all_reduce, ("step", t) an optimiser step ended. The position in the list is the order (the
# autograd engine runs a CPU backward, its hooks and DDP's launches on one thread), so whether an all-reduce
# began before backward's last gradient is read from positions, not from a clock a busy machine stretches.
EVENTS: list[tuple[str, float]] = []


class ClockedSGD(torch.optim.SGD):
    """SGD with momentum (not scale-invariant like Adam: a gradient A times too big shows in the weights) that
    notes when each step ends, so the course times steps itself."""

    def step(self, closure=None):
        result = super().step(closure)
        STEP_CLOCK.append(time.perf_counter())
        EVENTS.append(("step", STEP_CLOCK[-1]))
        return result


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return ClockedSGD(model.parameters(), lr=LR, momentum=MOMENTUM)


# --- the single-process reference --------------------------------------------------------------------------
def epoch_permutation(samples: int, epoch: int, seed: int) -> torch.Tensor:
    """The order DistributedSampler(shuffle=True, seed=seed) deals epoch `epoch` in (after set_epoch)."""
    gen = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(samples, generator=gen)


def global_batch_indices(step: int, global_batch: int, samples: int, seed: int) -> torch.Tensor:
    """The samples optimiser step `step` (0-based) covers, whatever the world size and accumulation."""
    per_epoch = samples // global_batch
    epoch, j = divmod(step, per_epoch)
    return epoch_permutation(samples, epoch, seed)[j * global_batch:(j + 1) * global_batch]


# --- FLOPs and the CPU's peak -------------------------------------------------------------------------------
def flops_per_sample() -> int:
    """Model FLOPs of one sample's forward + backward: 2 per multiply-add forward, twice that backward."""
    macs = IN_FEATURES * HIDDEN + HIDDEN * HIDDEN + HIDDEN * OUT_FEATURES
    return 6 * macs


def calibrate_peak_flops(n: int = 384, repeats: int = 20) -> float:
    """The 'calibrated peak' of one CPU thread: the best rate of an fp32 n x n matmul (FLOP/s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # each rank runs one thread (OMP_NUM_THREADS=1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2 * n ** 3 / best


# --- inside each rank: the probe (install/report) and the driver the grader launches -------------------------
_COUNTS: dict = {}


def _reset_counts() -> None:
    _COUNTS.clear()
    _COUNTS.update(bucket_reductions=collections.Counter(), python_all_reduce=0, saves=[], allreduce_s=0.0,
                   allreduce_spans=[], course_hook_calls=0)
    STEP_CLOCK.clear()
    EVENTS.clear()


_ALL_REDUCE = None  # torch.distributed.all_reduce as it was before install() wrapped it


class _HookSlot:
    """The comm hook the learner's train() registered on a counted DDP model (None: DDP's default reduction),
    run inside the course's counting hook: DDP takes one hook per model, and the course's is already there."""

    def __init__(self) -> None:
        self.registered: tuple | None = None  # (state, hook)


def _counting_hook(slot: _HookSlot, bucket):
    """DDP's default reduction (divide by the world, all-reduce) or the learner's registered hook, counted per
    bucket and timed launch to completion. DDP calls its reducer's collectives from C++, which no Python wrapper
    of torch.distributed sees; a comm hook is where they meet."""
    import torch.distributed as dist

    _COUNTS["bucket_reductions"][bucket.index()] += 1
    launched = time.perf_counter()
    EVENTS.append(("bucket", launched))
    if slot.registered is None:
        future = _ALL_REDUCE(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future()
    else:
        state, hook = slot.registered
        future = hook(state, bucket)

    def done(fut):
        finished = time.perf_counter()
        _COUNTS["allreduce_s"] += finished - launched  # launch to completion, overlapped or not
        _COUNTS["allreduce_spans"].append((launched, finished))  # placed in its step by the judge
        value = fut.value()
        return value[0] if isinstance(value, list) else value  # all_reduce's future holds a list, a hook's a tensor

    return future.then(done)


def course_comm_hook(state, bucket):
    """The hook the judge passes as train(comm_hook=...): DDP's default reduction, counting its calls, so the
    judge sees whether train() registered the hook it was given (main() times the all-reduce share with one)."""
    import torch.distributed as dist

    _COUNTS["course_hook_calls"] += 1
    future = _ALL_REDUCE(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])


def _gradient_ready(param) -> None:
    EVENTS.append(("grad", time.perf_counter()))


def install() -> None:
    """Before the learner's import: every DDP model gets the counting hook and its parameters a hook noting when
    their gradient is accumulated (before DDP's own hook sees it); all_reduce and torch.save counted."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    global _ALL_REDUCE
    _reset_counts()
    ddp_init, ddp_register, all_reduce, save = DDP.__init__, DDP.register_comm_hook, dist.all_reduce, torch.save
    _ALL_REDUCE = all_reduce

    def counted_init(self, *args, **kwargs):
        ddp_init(self, *args, **kwargs)
        self._course_hook_slot = _HookSlot()
        ddp_register(self, self._course_hook_slot, _counting_hook)
        for param in self.module.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(_gradient_ready)

    def routed_register(self, state, hook):
        """The learner's hook goes into the course's slot, with DDP's own rules: callable, once per model."""
        slot = getattr(self, "_course_hook_slot", None)
        if slot is None:
            return ddp_register(self, state, hook)
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        if slot.registered is not None:
            raise RuntimeError("register_comm_hook can only be called once per DistributedDataParallel model")
        slot.registered = (state, hook)

    def counted_all_reduce(*args, **kwargs):
        _COUNTS["python_all_reduce"] += 1
        EVENTS.append(("allreduce", time.perf_counter()))
        return all_reduce(*args, **kwargs)

    def counted_save(obj, f, *args, **kwargs):
        target = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", repr(f))
        _COUNTS["saves"].append(os.path.abspath(str(target)))
        return save(obj, f, *args, **kwargs)

    DDP.__init__ = counted_init
    DDP.register_comm_hook = routed_register
    dist.all_reduce = counted_all_reduce
    torch.save = counted_save


def report() -> dict:
    return {"installed": bool(_COUNTS)}


def _peak_memory_mb(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_experiments(experiments: list[dict], module: str = "train_ddp", function: str = "train") -> list[dict]:
    """Call the learner's train(**config) once per experiment in this rank; for each, what it returned and
    what the course saw: its wall time, the optimiser steps' end times, bucket reductions, saves, the order of
    gradients, all-reduces and steps (EVENTS), peak memory. An experiment that raises ends the list with
    {"error": its traceback's tail}: the ones before it stand (their checks go on), none after it runs."""
    train = getattr(importlib.import_module(module), function)
    device = os.environ.get("INFRACOURSE_DEVICE", "cpu")
    results = []
    for config in experiments:
        _reset_counts()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if config.get("comm_hook") == "course":  # a function cannot travel in the launch's arguments
            config = {**config, "comm_hook": course_comm_hook}
        started = time.perf_counter()
        try:
            out = train(**config, device=device)
        except Exception:  # the learner's (a keyword train() lacks, say): this run's checks fail, not the earlier
            results.append({"error": traceback.format_exc()[-3000:]})
            break
        wall = time.perf_counter() - started
        results.append({"out": out, "wall_s": wall, "step_ends": list(STEP_CLOCK),
                        "bucket_reductions": dict(_COUNTS["bucket_reductions"]),
                        "python_all_reduce": _COUNTS["python_all_reduce"], "saves": list(_COUNTS["saves"]),
                        "allreduce_s": _COUNTS["allreduce_s"], "allreduce_spans": list(_COUNTS["allreduce_spans"]),
                        "course_hook_calls": _COUNTS["course_hook_calls"],
                        "events": list(EVENTS), "peak_memory_mb": _peak_memory_mb(device)})
    return results


if __name__ == "__main__":  # `python -m infracourse.kit.ddp_reference`: the peak the report's MFU divides by
    print(f"calibrated CPU peak (one thread): {calibrate_peak_flops() / 1e9:.2f} GFLOP/s")
