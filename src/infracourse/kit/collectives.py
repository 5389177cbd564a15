"""Week 11, collectives by hand: the course's references, the nccl-tests bandwidth factors, the alpha-beta cost
model, and the code that runs in each rank around the learner's collectives (`grade_rank`).

Judge side: `case_inputs` rebuilds from the seed the very tensors every rank was given, so the exact result of a
collective is known in the judge (a float64 sum) without trusting anything a rank returns; `sum_bound` is how far
a correct ring may drift from it (one rounding per addition in the tensor's own dtype); `busbw_factor`,
`fit_alpha_beta` and `read_sweep` turn timings into the figures the learner reports.

Rank side: `grade_rank` is started by grading.torchrun (module `infracourse.kit.collectives`) with the probe
`infracourse.kit.dist_probes`; it imports the learner's `collectives.py`, calls each function on the judge's
cases inside a probe scope, notes the order in which ring_all_reduce calls ring_reduce_scatter and
ring_all_gather, times ring_all_reduce at a few sizes in turns with the library's all_reduce (the control; a
barrier, then this rank's clock around one call) and returns everything. All of it is evidence: the learner's
code shares the process. So the clock and the control are taken before the learner's module is imported, the
control is timed once before that import too, the functions on its path are compared after every timed round
with those taken before (a patch shows), and each timed ring's answer is compared with the library's on the same
tensor (a ring that is right only at the correctness cases' small sizes shows).
"""
from __future__ import annotations

import csv
import io
import math
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

from infracourse.kit import dist_probes

# nccl-tests (doc/PERFORMANCE.md): busbw = algbw * factor, algbw = bytes / time
BUSBW_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
                 "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float64": 2.0 ** -53}
SWEEP_COLUMNS = ("world_size", "impl", "bytes", "rep", "seconds")
# impl: "ring" is the learner's ring_all_reduce, "library" torch.distributed.all_reduce timed in turns with it (the
# control: whatever load slows one slows the other, so their ratio holds where the wall clock does not)
SWEEP_IMPLS = ("ring", "library")
KIB, MIB = 1024, 1024 * 1024


def busbw_factor(op: str, world_size: int) -> float:
    return BUSBW_FACTORS[op](world_size)


def algbw_gbps(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes/s): the tensor's size over the collective's time."""
    return nbytes / seconds / 1e9


def busbw_gbps(op: str, world_size: int, nbytes: float, seconds: float) -> float:
    """Bus bandwidth in GB/s: algbw times the nccl-tests factor of the collective."""
    return algbw_gbps(nbytes, seconds) * busbw_factor(op, world_size)


def ring_bytes_sent(op: str, world_size: int, nbytes: int) -> float:
    """What each rank sends in a bandwidth-optimal ring (the same factor as busbw: that is why it exists)."""
    return busbw_factor(op, world_size) * nbytes


def medians(sizes: list[int], seconds: list[float]) -> dict[int, float]:
    """The median time of each size."""
    by_size: dict[int, list[float]] = {}
    for size, t in zip(sizes, seconds):
        by_size.setdefault(int(size), []).append(float(t))
    return {size: statistics.median(ts) for size, ts in sorted(by_size.items())}


def fit_alpha_beta(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """(alpha seconds, beta seconds per byte) of t = alpha + beta * bytes, fitted to the median time of each size
    by least squares on RELATIVE errors (each residual divided by that size's median), so the small sizes fix
    alpha and the large ones beta across six decades of time. Closed form of the weighted least squares."""
    points = medians(sizes, seconds)
    if len(points) < 2:
        raise ValueError("a fit needs at least two sizes")
    xs, ys = list(points), list(points.values())
    ws = [1.0 / (y * y) for y in ys]
    sw = sum(ws)
    sx = sum(w * x for w, x in zip(ws, xs))
    sy = sum(w * y for w, y in zip(ws, ys))
    sxx = sum(w * x * x for w, x in zip(ws, xs))
    sxy = sum(w * x * y for w, x, y in zip(ws, xs, ys))
    det = sw * sxx - sx * sx
    beta = (sw * sxy - sx * sy) / det
    alpha = (sy - beta * sx) / sw
    return alpha, beta


def read_sweep(path: Path) -> list[dict[str, Any]]:
    """The rows of a sweep CSV (numbers, and impl: ring or library); ValueError naming the first problem."""
    return parse_sweep(Path(path).read_text(encoding="utf-8"))


def parse_sweep(text: str) -> list[dict[str, Any]]:
    """read_sweep of a CSV's text."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in SWEEP_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"columns {missing} are missing (the header must hold {', '.join(SWEEP_COLUMNS)})")
    rows = []
    for line, row in enumerate(reader, start=2):
        try:
            parsed = {"world_size": int(row["world_size"]), "impl": row["impl"], "bytes": int(row["bytes"]),
                      "rep": int(row["rep"]), "seconds": float(row["seconds"])}
        except (TypeError, ValueError):
            raise ValueError(f"line {line} is not numbers: {dict(row)}") from None
        if parsed["impl"] not in SWEEP_IMPLS:
            raise ValueError(f"line {line}: impl = {row['impl']!r} (one of {', '.join(SWEEP_IMPLS)})")
        if not (math.isfinite(parsed["seconds"]) and parsed["seconds"] > 0):
            raise ValueError(f"line {line}: seconds = {row['seconds']} (a time must be a positive number)")
        rows.append(parsed)
    return rows


# ---------------------------------------------------------------------------------------------- the judge's inputs
def case_inputs(seed: int, index: int, case: dict, world_size: int) -> list:
    """Every rank's input of case `index`, as the rank builds it (same generator, same bits), on the CPU."""
    import torch

    dtype = getattr(torch, case["dtype"])
    out = []
    for rank in range(world_size):
        n = case["sizes"][rank] if case["op"] == "all_gather" else case["n"]
        generator = torch.Generator().manual_seed((seed * 1_000_003 + index * 101 + rank) % 2**63)
        out.append(torch.randn(n, generator=generator).to(dtype))
    return out


def reference_sum(inputs: list):
    """The exact sum of the ranks' inputs, in float64."""
    import torch

    return torch.stack([x.double() for x in inputs]).sum(0) if inputs[0].numel() else inputs[0].double()


def sum_bound(inputs: list, dtype_name: str):
    """Elementwise bound on |ring result - exact sum|: each of the N-1 additions and the final rounding may round
    once in the dtype, each by at most the unit roundoff times the sum of magnitudes."""
    import torch

    magnitude = torch.stack([x.double().abs() for x in inputs]).sum(0) if inputs[0].numel() else \
        inputs[0].double()
    return len(inputs) * 1.01 * UNIT_ROUNDOFF[dtype_name] * magnitude + 1e-30


# ------------------------------------------------------------------------------------------------- in each rank
def grade_rank(seed: int, cases: list[dict], timed_sizes: list[int], warmup: int = 2, reps: int = 25,
               module: str = "collectives") -> dict:
    """Run the judge's cases on the learner's collectives in this rank; returns outputs, order and timings."""
    import importlib

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    # the control and the clock, taken before the learner's module is imported; so is a first timing of the
    # control (`clean`), which a patch made at import (a slower ProcessGroup.allreduce) cannot reach
    library, clock = dist.all_reduce, time.perf_counter
    untouched = _control_path(dist)
    clean = {int(n): _time_control(library, clock, n, device, warmup, reps=10) for n in timed_sizes}
    learner = importlib.import_module(module)
    order: list[str] = []
    for name in ("ring_reduce_scatter", "ring_all_gather"):
        original = getattr(learner, name)

        def noted(*args, _name=name, _fn=original, **kwargs):
            order.append(_name)
            return _fn(*args, **kwargs)

        setattr(learner, name, noted)
    results, failed = [], {}
    for index, case in enumerate(cases):
        x = case_inputs(seed, index, case, world)[rank].to(device)
        mine = x.clone()
        order.clear()
        scope = f"case {index}"
        if case["op"] in failed:  # that function already raised: the ranks would wait on each other
            results.append({"skipped": failed[case["op"]], "scope": scope})
            continue
        dist.barrier()
        try:
            with dist_probes.scope(scope):
                if case["op"] == "reduce_scatter":
                    out = learner.ring_reduce_scatter(x)
                elif case["op"] == "all_gather":
                    out = learner.ring_all_gather(x, list(case["sizes"]))
                elif case["op"] == "all_reduce":
                    out = learner.ring_all_reduce(x)
                else:
                    out = learner.broadcast(x, case["src"])
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # the learner's: reported per case, the other functions still run
            failed[case["op"]] = index
            tail = traceback.format_exception(type(exc), exc, exc.__traceback__)
            results.append({"error": "".join(tail)[-2000:], "not_written": isinstance(exc, NotImplementedError),
                            "scope": scope})
            continue
        results.append({"output": out.detach().cpu().clone() if isinstance(out, torch.Tensor) else None,
                        "returned": type(out).__name__, "order": list(order), "scope": scope,
                        "input_changed": bool(case["op"] in ("reduce_scatter", "all_gather")
                                              and not torch.equal(mine, x))})
    if "all_reduce" in failed:
        timed_sizes = []
    timings, control, timed_error, replaced = {}, {}, {}, set()
    for nbytes in timed_sizes:
        x = torch.randn(nbytes // 4, device=device)
        samples: dict[str, list[float]] = {"ring": [], "library": []}
        error, scale = 0.0, 0.0
        for rep in range(warmup + reps):
            answers = {}
            for impl in SWEEP_IMPLS:  # in turns, call by call: one load slows both
                y = x.clone()
                seconds, returned = _timed(learner.ring_all_reduce if impl == "ring" else library, y, clock, device,
                                           scope=f"timed {impl} {nbytes}")
                if rep >= warmup:
                    samples[impl].append(seconds)
                # the ring's result is what it returns (as in the correctness cases); the library's is y
                answers[impl] = returned if impl == "ring" and isinstance(returned, torch.Tensor) else y
            replaced |= {name for name, fn in _control_path(dist).items() if fn is not untouched[name]}
            # what was timed is what is checked: the ring's answer on the timed tensor against the library's
            ring, want = answers["ring"], answers["library"]
            error = max(error, float((ring - want).abs().max()) if ring.shape == want.shape else math.inf)
            scale = max(scale, float(want.abs().max()))
        timings[int(nbytes)], control[int(nbytes)] = samples["ring"], samples["library"]
        timed_error[int(nbytes)] = {"max_abs_error": error, "max_abs": scale}
    return {"rank": rank, "world_size": world, "cases": results, "timings": timings, "control": control,
            "clean_control": clean, "timed_error": timed_error, "control_replaced": sorted(replaced)}


def sweep_rank(script: str = "sweep.py", module: str = "collectives") -> dict:
    """The learner's sweep program run in this rank as `torchrun --nproc-per-node 2 sweep.py` runs it, with the
    judge watching the calls it times.

    ring_all_reduce (wrapped in the learner's module before the program imports it) and the library's all_reduce
    (outside the ring) are timed by the judge's own clock, taken before the learner's module was imported, call
    by call, by tensor size: the program's rows can then be held against the very calls they say they timed, at
    the same moment and load. The process group is the driver's: the program's own init_process_group and
    destroy_process_group do nothing. Rank 0 returns the CSV the program wrote in this rank's working folder."""
    import importlib
    import os
    import runpy
    import sys

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    rank = dist.get_rank()
    library, clock = dist.all_reduce, time.perf_counter
    untouched = _control_path(dist)
    learner = importlib.import_module(module)
    ring = learner.ring_all_reduce
    seen: dict[str, dict[int, list[float]]] = {"ring": {}, "library": {}}
    in_ring = [0]

    def _watched(impl: str, call, tensor, args, kwargs):
        nbytes = tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else -1
        started = clock()
        try:
            return call(tensor, *args, **kwargs)
        finally:
            seen[impl].setdefault(nbytes, []).append(clock() - started)

    def watched_ring(x, *args, **kwargs):
        in_ring[0] += 1
        try:
            with dist_probes.scope("sweep ring"):
                return _watched("ring", ring, x, args, kwargs)
        finally:
            in_ring[0] -= 1

    def watched_library(tensor, *args, **kwargs):
        if in_ring[0]:
            return library(tensor, *args, **kwargs)
        return _watched("library", library, tensor, args, kwargs)

    shims = {"init_process_group": lambda *args, **kwargs: None,
             "destroy_process_group": lambda *args, **kwargs: None, "all_reduce": watched_library}
    saved = {(where, name): getattr(where, name) for where in (dist, c10d) for name in shims}
    learner.ring_all_reduce = watched_ring
    for (where, name) in saved:
        setattr(where, name, shims[name])
    folder = Path.cwd() / f"sweep-rank{rank}"
    folder.mkdir(parents=True, exist_ok=True)
    here, argv = os.getcwd(), sys.argv
    path = str(Path(learner.__file__).resolve().parent / script)
    try:
        os.chdir(folder)
        sys.argv = [path]
        with dist_probes.scope("sweep"):
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as exit_:
                if exit_.code not in (None, 0):
                    raise
    finally:
        os.chdir(here)
        sys.argv = argv
        learner.ring_all_reduce = ring
        for (where, name), original in saved.items():
            setattr(where, name, original)
    written = folder / "sweep.csv"
    csv_text = written.read_text(encoding="utf-8", errors="replace") if rank == 0 and written.is_file() else None
    replaced = sorted(name for name, fn in _control_path(dist).items() if fn is not untouched[name])
    return {"rank": rank, "csv": csv_text, "seen": seen, "control_replaced": replaced}


def _control_path(dist) -> dict:
    """The Python-visible functions a call of the control goes through (replacing one slows only the control)."""
    import torch

    c10d = torch._C._distributed_c10d
    path = {"torch.distributed.all_reduce": dist.all_reduce,
            "torch.distributed.distributed_c10d.all_reduce": dist.distributed_c10d.all_reduce,
            "torch.distributed.barrier": dist.barrier, "time.perf_counter": time.perf_counter}
    for cls in (c10d.ProcessGroup, c10d.Backend, getattr(c10d, "ProcessGroupGloo", None)):
        for method in ("allreduce", "barrier"):
            if cls is not None and method in cls.__dict__:
                path[f"{cls.__name__}.{method}"] = cls.__dict__[method]
    return path


def _timed(call, y, clock, device: str, scope: str = "control before import"):
    """(seconds, what `call(y)` returned): a barrier so every rank starts together, then this rank's clock around
    the call (a GPU's queue drained on both sides of it), whose calls the probe counts under `scope`."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if device == "cuda":
        torch.cuda.synchronize()
    started = clock()
    with dist_probes.scope(scope):
        returned = call(y)
    if device == "cuda":
        torch.cuda.synchronize()  # NCCL work is asynchronous: wait for it inside the clock
    return clock() - started, returned


def _time_control(library, clock, nbytes: int, device: str, warmup: int, reps: int) -> list[float]:
    """The library's all-reduce alone, timed as in the loop that follows (`_timed`)."""
    import torch

    x = torch.randn(nbytes // 4, device=device)
    return [seconds for rep in range(warmup + reps)
            for seconds, _ in [_timed(library, x.clone(), clock, device)] if rep >= warmup]
