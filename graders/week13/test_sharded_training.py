"""Week 13 sharded training under torchrun (gloo on the CPU): the learner's ZeRO-1 optimiser, FSDP2 wrapping and
activation checkpointing, each run by the course's in-rank driver (infracourse.kit.sharding.rank_main) on the
course's model and data, in two launches (world 2, and world 3 so shards are uneven).

Same workload and semantics everywhere: the same seeded model, the same global batch per step split evenly over
the ranks (each rank's mean loss, averaged over ranks = the global batch's mean loss), the same AdamW
hyper-parameters. The judge's reference is its own single-process torch.optim.AdamW run on the global batch;
every rank's final parameters must equal it. What the driver measures inside a rank (bytes of tensors the
optimiser keeps, local shard sizes, bytes autograd saves) is evidence, held against the judge's own counts."""
from __future__ import annotations

import pytest
import torch

from infracourse.grader import LabCheckFailed, collect, cpu_contention, start_ranks
from infracourse.kit import sharding as S
from week13_judging import checkpoint_reference, zero_reference

WORLDS = (2, 3)
PARAM_TOL = 1e-4        # float32 sums in another order over 10 AdamW steps
STATE_FACTOR = 1.6      # per-rank optimiser bytes at most 1.6 x (unsharded moments / N): an extra shard is allowed
CHECKPOINT_FRACTION = 0.5
LAUNCH_TIMEOUT_S = 150
TRAINING_STATE_BYTES = 16  # per fp32 parameter: weight, gradient, exp_avg, exp_avg_sq


def start(learner, seed, tmp_path_factory, world: int, experiments: dict, device: str = "cpu"):
    scratch = tmp_path_factory.mktemp(f"{device}-world{world}")
    proc = start_ranks("infracourse.kit.sharding", "rank_main", learner_dir=learner.root, world_size=world,
                       kwargs={"experiments": experiments, "seed": seed}, device=device, scratch=scratch,
                       probe="infracourse.kit.sharding")  # times the collectives inside each step
    return proc, scratch


@pytest.fixture(scope="module")
def launches(learner, seed, tmp_path_factory) -> dict:
    """Both CPU worlds started at once, then collected: {world: RanksRun}. A world that lost a rank to a runtime
    signal with no Python error (RanksRun.died_by_signal: gloo on a loaded machine) is launched once more."""
    def experiments(world):
        return {"zero1": "zero1", "fsdp": "fsdp"} | ({"checkpoint": "checkpointing"} if world == 2 else {})

    procs = {world: start(learner, seed, tmp_path_factory, world, experiments(world)) for world in WORLDS}
    runs = {world: collect(proc, scratch=scratch, world_size=world, timeout_s=LAUNCH_TIMEOUT_S)
            for world, (proc, scratch) in procs.items()}
    for world, run in runs.items():
        if run.died_by_signal():
            proc, scratch = start(learner, seed, tmp_path_factory, world, experiments(world))
            runs[world] = collect(proc, scratch=scratch, world_size=world, timeout_s=LAUNCH_TIMEOUT_S)
            runs[world].attempts = 2
    return runs


def results(launches, name: str, world: int, seed: int) -> list[dict]:
    """Experiment `name`'s result from every rank of `world`, or a failure that says what went wrong where."""
    run = launches[world]
    if (failure := run.failure()) is not None:
        raise LabCheckFailed(f"the world-{world} launch failed (seed {seed}): {failure}")
    found = []
    for rank, out in enumerate(run.outputs):
        part = out.get(name) if isinstance(out, dict) else None
        if not isinstance(part, dict):
            raise LabCheckFailed(f"rank {rank} of world {world} returned no {name!r} result (seed {seed})")
        if "error" in part:
            unwritten = "NotImplementedError" in part["error"]
            raise LabCheckFailed(
                f"{'not written yet: ' if unwritten else ''}rank {rank} of world {world} raised in the {name} "
                f"experiment (seed {seed}):\n{part['error'][-1200:]}")
        found.append(part)
    return found


def _compare_params(got, want: torch.Tensor, what: str) -> str | None:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"{what}: parameters of shape {getattr(got, 'shape', None)}, expected {tuple(want.shape)}"
    if not torch.isfinite(got).all():
        return f"{what}: parameters hold NaN or inf"
    err = (got - want).abs().max().item()
    if err > PARAM_TOL * (1 + want.abs().max().item()):
        index = int((got - want).abs().argmax())
        return (f"{what}: parameters differ from the unsharded AdamW run by up to {err:.3g} (element {index} of the "
                f"flattened parameters: {got[index].item():.6g}, expected {want[index].item():.6g})")
    return None


def require_zero1_params(launches, world: int, seed: int, where: str = "") -> None:
    ranks = results(launches, "zero1", world, seed)
    want = zero_reference(seed, world, S.ZERO_STEPS)
    for rank, part in enumerate(ranks):
        if (why := _compare_params(part.get("params"), want, f"rank {rank} of {world}{where}")) is not None:
            raise LabCheckFailed(
                f"{why} after {S.ZERO_STEPS} steps of Zero1AdamW (seed {seed}; {want.numel()} parameters, shards "
                f"of ceil({want.numel()}/{world})). Every rank must end with the parameters of one unsharded "
                "torch.optim.AdamW on the global batch: average the gradients over ranks, update your shard with "
                "AdamW (decoupled weight decay, bias correction), then all-gather every shard into every rank's "
                "parameters.")


def require_zero1_state(launches, world: int, seed: int, full: int) -> int:
    """The largest per-rank optimiser bytes the course measured, after checking them against 1/N."""
    measured = [part.get("state_bytes") for part in results(launches, "zero1", world, seed)]
    if not all(type(b) is int for b in measured):
        raise LabCheckFailed(f"the course could not measure the optimiser's tensors in world {world}: {measured}")
    limit = STATE_FACTOR * full / world + 1024
    for rank, nbytes in enumerate(measured):
        if nbytes > limit:
            raise LabCheckFailed(
                f"rank {rank} of {world} keeps {nbytes:,} B of tensors in its optimiser (measured by the course "
                f"inside the rank: every tensor reachable from your Zero1AdamW object and your module's globals, "
                f"the model's own parameters and gradients left out), against {full:,} B for the unsharded "
                f"AdamW moments: ZeRO-1 keeps about 1/{world} of them per rank (at most {limit:,.0f} B here; "
                f"seed {seed}). Keep exp_avg and exp_avg_sq for your shard only, and build full-size flat "
                "buffers inside step() rather than keeping them between steps.")
    if sum(measured) < 0.95 * full:
        raise LabCheckFailed(
            f"the ranks of world {world} keep {measured} B in their optimisers, {sum(measured):,} in all, less "
            f"than the {full:,} B of AdamW moments some rank must hold: keep your state as attributes of the "
            "Zero1AdamW object so the course can measure it")
    return max(measured)


@pytest.mark.check("zero1-matches-adamw")
def test_zero1_matches_adamw(launches, seed, record):
    for world in WORLDS:
        require_zero1_params(launches, world, seed)
    record("zero1 launches", len(WORLDS))


def require_shards_exchanged(launches, world: int, seed: int, param_bytes: int) -> int:
    """The mechanism's traffic, which no copy of a finished run can stand in for: a ZeRO-1 step reduces every
    gradient (a buffer the size of the parameters: an all-reduce's tensor, a reduce-scatter's input, or the
    per-shard reduces summed) and gathers every updated shard into every rank (the parameters' size again: an
    all-gather's output, or the shards' broadcasts summed). Counted by the course's probe, as each call's
    largest tensor, in every timed step of every rank."""
    moved = step_figures(launches, "zero1", world, seed)["bytes"]
    if moved < 2 * param_bytes:
        raise LabCheckFailed(
            f"the ZeRO-1 steps of world {world} moved {moved:,} B per step through collectives (the course's count: "
            f"each call's largest tensor; seed {seed}), less than twice the parameters' {param_bytes:,} B. Each step "
            "reduces every gradient (the parameters' size) and all-gathers every updated shard into every rank (the "
            "parameters' size again); a rank that gets its parameters any other way did not shard the update")
    return moved


@pytest.mark.check("zero1-state-sharded")
def test_zero1_state_sharded(launches, seed, record):
    model = S.make_model(seed)
    full = S.unsharded_state_bytes(model)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for world in WORLDS:
        most = require_zero1_state(launches, world, seed, full)
        record(f"optimizer state bytes per rank, world {world}", most, unit="B", bytes=most)
        moved = require_shards_exchanged(launches, world, seed, param_bytes)
        record(f"zero1 collective bytes per step, world {world}", moved, unit="B", bytes=moved)
    record("unsharded optimizer state bytes", full, unit="B", bytes=full)


def require_fsdp(launches, world: int, seed: int, where: str = "") -> int:
    """The largest local parameter count of a rank, after checking the trained parameters against DDP's."""
    ranks = results(launches, "fsdp", world, seed)
    want = zero_reference(seed, world, S.FSDP_STEPS)
    for rank, part in enumerate(ranks):
        if not part.get("fsdp_modules"):
            raise LabCheckFailed(f"rank {rank} of {world}{where}: shard_model returned a model with no module "
                                 "wrapped by fully_shard (torch.distributed.fsdp.fully_shard)")
        linears, in_units = part.get("linears") or [], part.get("linears_in_units") or []
        if not linears or len(in_units) != len(linears):
            left = [name for name in linears if name not in in_units]
            raise LabCheckFailed(
                f"rank {rank} of {world}{where}: the Linear layers {left} belong to the root's FSDP unit, not one "
                f"of their own ({len(in_units)} of {len(linears)} layers in a unit below the root, read by the "
                f"course from the model shard_model returned; seed {seed}). Each rank still holds 1/{world} of "
                "the parameters between steps, and the weights come out right, but a root-only wrap gathers the "
                "whole model in one all-gather at the start of forward and keeps it until backward ends: the "
                "peak is the unsharded model in every rank. Call fully_shard on each Linear layer first, then "
                "on the root")
        if (why := _compare_params(part.get("params"), want, f"rank {rank} of {world}{where}")) is not None:
            raise LabCheckFailed(
                f"{why} after {S.FSDP_STEPS} AdamW steps of the fully_shard model (seed {seed}): it must train "
                "exactly as DDP (one process on the global batch) does. Apply fully_shard to each Linear layer, "
                "then to the root model, and return it.")
    local = [part["local_numel"] for part in ranks]
    numel = want.numel()
    if max(local) > 1.6 * numel / world + 64:
        raise LabCheckFailed(
            f"the ranks of world {world}{where} hold {local} parameter elements locally, of {numel}: fully_shard "
            f"should leave each about 1/{world} (seed {seed}). Wrap every Linear layer, not only the root.")
    full = TRAINING_STATE_BYTES * numel  # fp32 weights, gradients, exp_avg and exp_avg_sq, unsharded
    for rank, part in enumerate(ranks):
        held = part.get("held_bytes") or {}
        total = sum(held.values())
        if not held or total > 1.6 * full / world + 1024:
            raise LabCheckFailed(
                f"rank {rank} of {world}{where} holds {total:,} B of training state after the last step "
                f"({held}; the course's reading of the local shards of the parameters, their gradients and "
                f"AdamW's moments), against {full:,} B unsharded: FSDP leaves each rank about 1/{world} of each "
                f"(seed {seed}). Return the model fully_shard wrapped, and let torch.optim.AdamW build its state "
                "from its sharded parameters")
    return max(local)


def fsdp_state_bytes(launches, world: int, seed: int) -> int:
    """The most bytes of parameters, gradients and optimiser state a rank of `world` holds (course reading)."""
    return max(sum(part["held_bytes"].values()) for part in results(launches, "fsdp", world, seed))


@pytest.mark.check("fsdp-matches-ddp")
def test_fsdp_matches_ddp(launches, seed, record):
    for world in WORLDS:
        most = require_fsdp(launches, world, seed)
        record(f"fsdp parameter bytes per rank, world {world}", 4 * most, unit="B", bytes=4 * most)
        held = fsdp_state_bytes(launches, world, seed)
        record(f"fsdp training-state bytes per rank, world {world}", held, unit="B", bytes=held)


@pytest.mark.check("sharded-nccl")
def test_sharded_on_gpus(learner, seed, tmp_path_factory, record):
    """The same ZeRO-1 and FSDP2 experiments on two GPUs under NCCL (blocked on machines with fewer)."""
    proc, scratch = start(learner, seed, tmp_path_factory, 2, {"zero1": "zero1", "fsdp": "fsdp"}, device="cuda")
    launches = {2: collect(proc, scratch=scratch, world_size=2, timeout_s=LAUNCH_TIMEOUT_S)}
    require_zero1_params(launches, 2, seed, " (NCCL)")
    most = require_zero1_state(launches, 2, seed, S.unsharded_state_bytes(S.make_model(seed)))
    local = require_fsdp(launches, 2, seed, " (NCCL)")
    record("optimizer state bytes per rank, 2 GPUs", most, unit="B", bytes=most)
    record("fsdp parameter bytes per rank, 2 GPUs", 4 * local, unit="B", bytes=4 * local)


@pytest.mark.check("checkpoint-saves-less")
def test_checkpoint_saves_less(launches, seed, record):
    ranks = results(launches, "checkpoint", 2, seed)
    want = checkpoint_reference(seed)  # the judge's own plain forward, outputs, gradients and saved bytes
    part = ranks[0]
    out, grads = part.get("out"), part.get("grads")
    if not isinstance(out, torch.Tensor) or out.shape != want["out"].shape or \
            not torch.allclose(out, want["out"], rtol=1e-5, atol=1e-6):
        raise LabCheckFailed(f"checkpointed_forward's output differs from model(x) (seed {seed}, x of shape (64, 32)): "
                             "checkpointing must not change the result")
    for name, g in want["grads"].items():
        got = grads.get(name) if isinstance(grads, dict) else None
        if not isinstance(got, torch.Tensor) or got.shape != g.shape or not torch.allclose(got, g, rtol=1e-4,
                                                                                            atol=1e-6):
            raise LabCheckFailed(f"the gradient of {name} after checkpointed_forward differs from the plain "
                                 f"forward's (seed {seed}): recomputation in backward must give the same gradients")
    if part.get("plain_bytes") != want["bytes"]:
        raise LabCheckFailed(f"the plain forward saved {part.get('plain_bytes')} B in the rank but {want['bytes']} B "
                             "in the judge: the course's measurement was disturbed")
    nbytes = part["bytes"]
    if not nbytes <= CHECKPOINT_FRACTION * want["bytes"]:
        raise LabCheckFailed(
            f"checkpointed_forward made autograd save {nbytes:,} B for backward, the plain forward {want['bytes']:,} "
            f"B (measured by the course's saved_tensors_hooks around your forward; seed {seed}); at most "
            f"{CHECKPOINT_FRACTION:.0%} expected. Run each block through torch.utils.checkpoint.checkpoint, so only "
            "its input is kept and its insides are recomputed in backward.")
    record("saved activation bytes, plain", want["bytes"], unit="B", bytes=want["bytes"])
    record("saved activation bytes, checkpointed", nbytes, unit="B", bytes=nbytes)


def step_figures(launches, name: str, world: int, seed: int) -> dict:
    """The course's clock of experiment `name` in `world`: per rank, the steps after the first (the first builds
    buffers and warms gloo's connections), each timed by the course around forward, backward and the optimiser
    step with the time and payload inside collectives read before and after. Held against the judge's own
    clock around the launch. Returns the step time (median of the slowest rank), the communication share (time
    inside collectives / step time, summed over the same steps, mean of the ranks), the payload per step (every
    step of every rank moves the same bytes in the same number of collective calls, or the message says which
    did not)."""
    ranks = results(launches, name, world, seed)
    shares, medians, payloads, calls = [], [], set(), set()
    for rank, part in enumerate(ranks):
        steps = part.get("steps") or []
        if len(steps) < 2:
            raise LabCheckFailed(f"the course clocked {len(steps)} {name} steps on rank {rank} of {world} (seed "
                                 f"{seed}): a course bug, not yours; please report it")
        timed = steps[1:]
        total, comm = sum(t["s"] for t in timed), sum(t["comm_s"] for t in timed)
        if not 0 <= comm <= total * 1.01 or total > launches[world].wall_s:
            raise LabCheckFailed(f"rank {rank} of {world}: {comm:.4f} s inside collectives in {total:.4f} s of "
                                 f"{name} steps, in a launch the grader clocked at {launches[world].wall_s:.2f} s: "
                                 "the course's clocks inside the rank were disturbed")
        shares.append(comm / total)
        medians.append(sorted(t["s"] for t in timed)[len(timed) // 2])
        payloads |= {t["comm_bytes"] for t in timed}
        calls |= {t.get("comm_calls") for t in timed}
    count = next(iter(calls)) if len(calls) == 1 else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise LabCheckFailed(f"the {name} steps of world {world} made {sorted(map(str, calls))} collective calls from "
                             f"step to step or rank to rank (seed {seed}): every step of the same workload should "
                             "make the same collectives, at least one (the gradients must be reduced)")
    if len(payloads) != 1:
        raise LabCheckFailed(f"the {name} steps of world {world} moved different payloads through collectives from "
                             f"step to step or rank to rank ({sorted(payloads)} B; seed {seed}): every step of the "
                             "same workload should communicate the same buffers")
    return {"step_s": max(medians), "share": sum(shares) / len(shares), "bytes": payloads.pop(), "calls": count}


@pytest.mark.check("sharded-step-measured")
def test_sharded_step_measured(launches, seed, record):
    """ZeRO-1 and FSDP2 on 2 ranks, the same workload (the course's model, global batch, AdamW): what a step
    costs in time, in communication (bytes and time inside collectives) and in peak memory per rank."""
    for name, label in (("zero1", "zero1"), ("fsdp", "fsdp")):
        got = step_figures(launches, name, 2, seed)
        record(f"{label} step ms, world 2", 1e3 * got["step_s"], unit="ms")
        record(f"{label} communication share, world 2", got["share"])
        record(f"{label} communication bytes per step, world 2", got["bytes"], unit="B", bytes=got["bytes"])
        record(f"{label} collective calls per step, world 2", got["calls"])
    peaks = [out.get("peak_memory_mb") for out in launches[2].outputs]
    if not all(isinstance(p, (int, float)) for p in peaks):
        raise LabCheckFailed(f"the course could not read the ranks' peak memory in world 2: {peaks}")
    record("peak memory mb per rank, world 2", max(peaks), unit="MiB")
    record("cpu contention (grader)", cpu_contention(), unit="x")  # the report's step times are the learner's run
