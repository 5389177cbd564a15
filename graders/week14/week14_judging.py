"""The shared judging helpers of the week14 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from infracourse.grader import LabCheckFailed, RanksRun, collect, rank_processes, run_ranks, start_ranks
from week14_references import moe_weights, overflowing_capacity


WORLD = 2
MICROBATCHES, TOP_K = 4, 2
STEPS, SAVE_EVERY, STEP_SECONDS = 30, 5, 0.1


class World:
    """The one launch of the tensor-, pipeline- and expert-parallel experiments."""

    def __init__(self, learner_dir: Path, seed: int, scratch: Path, device: str = "cpu"):
        self.seed = seed
        # 20 assignments per rank over 4 experts: the capacity makes every rank drop at least one, whatever the seed
        self.capacity = overflowing_capacity(moe_weights(seed), TOP_K)
        self.run = run_ranks("infracourse.kit.parallel_reference", "grade_rank", learner_dir=learner_dir,
                             world_size=WORLD, kwargs={"seed": seed, "microbatches": MICROBATCHES, "top_k": TOP_K,
                                                       "capacity": self.capacity},
                             device=device, probe="infracourse.kit.dist_probes", timeout_s=90, scratch=scratch)

    def results(self, name: str, what: str) -> list[dict]:
        """Every rank's result of one experiment; fails naming the rank and the learner's traceback."""
        if (failure := self.run.failure()) is not None:
            raise LabCheckFailed(f"the {WORLD}-rank launch that runs your {what} failed (seed {self.seed}): "
                                 f"{failure}")
        per_rank = [out.get(name) if isinstance(out, dict) else None for out in self.run.outputs]
        for rank, result in enumerate(per_rank):
            if not isinstance(result, dict):
                raise LabCheckFailed(f"rank {rank} returned nothing for {what} (seed {self.seed})")
            if "error" in result:
                if result.get("not_written"):
                    raise LabCheckFailed(f"{what} is not written yet: it raised NotImplementedError on rank {rank}")
                raise LabCheckFailed(f"{what} raised on rank {rank} (seed {self.seed}):\n{result['error']}")
        return per_rank

    def calls(self, rank: int, scope: str) -> dict[str, int]:
        probe = self.run.probes[rank] or {}
        return dict(probe.get(scope, {}).get("calls", {}))

    def moved(self, rank: int, scope: str) -> dict[str, int]:
        """The bytes the probe counted in one scope of one rank: per operation, and 'sent' / 'received'."""
        probe = self.run.probes[rank] or {}
        return dict(probe.get(scope, {}).get("bytes", {}))


@dataclass
class Recovery:
    """What the judge saw of a run killed once and restarted by torchrun."""
    run: RanksRun
    seed: int
    kill_step: int                       # rank 0 had logged this step when rank 1 was killed
    killed_at: float = 0.0               # time.time() of the SIGKILL
    complete_at_kill: list[int] = field(default_factory=list)  # steps whose checkpoint had DCP's .metadata
    # the same when the new world's ranks started: a save the killed world's rank 0 was finishing may complete
    # after the kill (rank 1 had sent its part), and then it is whole and the newest the restart can load
    complete_at_restart: list[int] = field(default_factory=list)
    planted: str = ""                    # the half-written checkpoint folder the judge added
    seen: dict[str, float] = field(default_factory=dict)      # judge-clocked: torn_down, new_ranks, first_step,
    #                                                           caught_up, finished
    lines: list[dict] = field(default_factory=list)           # rank 0's step lines, in order
    note: str = ""
    # (time.time(), CPU seconds) of the restarted world's rank 0, sampled by the judge at each poll of its log
    cpu: list[tuple[float, float]] = field(default_factory=list)
    redone: int = 0                      # step lines the restarted world wrote up to its catch-up line

    def where(self) -> str:
        return f"(seed {self.seed}, rank 1 killed after rank 0 logged step {self.kill_step})"

    def cpu_at(self, when: float) -> float | None:
        """The CPU seconds the restarted rank 0 had used by `when`: its first sample at or after it (the judge
        samples every 5 ms, so a few ms of CPU over), else its last; None if it was never sampled."""
        after = [used for at, used in self.cpu if at >= when]
        return after[0] if after else (self.cpu[-1][1] if self.cpu else None)

    def at_rest(self, since: float, until: float) -> float | None:
        """From `since` to `until` (until: a moment of the restarted world) as an idle machine gives it: the
        judge's wall time from `since` to seeing the new ranks started, plus the CPU seconds the new rank 0 had
        used by `until` (its interpreter, torch, the process group, the reload, the steps), plus step_seconds
        for each step it redid by then (sleep, standing for compute). On a busy machine the wall time of the
        restart stretches with whatever it waits behind (1.7 s quiet, 10 s at load 11 on 2 cores); this does
        not, so a figure measured under one load and graded under another still agree."""
        used = self.cpu_at(until)
        if used is None or "new_ranks" not in self.seen:
            return None
        sleeps = STEP_SECONDS * self.redone if until >= self.seen.get("caught_up", float("inf")) else 0.0
        return max(0.0, self.seen["new_ranks"] - since) + used + sleeps


LOG_READ_LIMIT = 2**20  # rank 0's log of an honest run is a few KiB; the judge, polling it every 5 ms, reads no more


def _lines(path: Path) -> list[dict]:
    """Rank 0's step lines that parse (the last one may be half-written), from the log's first LOG_READ_LIMIT
    bytes: lines past them (a log flooded by learner code) are never read, so that run's checks fail."""
    found = []
    if path.exists():
        with path.open("rb") as log:
            head = log.read(LOG_READ_LIMIT).decode(errors="replace")
        for text in head.splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict) and type(line.get("step")) is int and type(line.get("restart")) is int:
                found.append(line)
    return found


def _complete(checkpoints: Path) -> list[int]:
    steps = []
    for folder in checkpoints.glob("step_*"):
        if (folder / ".metadata").is_file() and folder.name[5:].isdigit():
            steps.append(int(folder.name[5:]))
    return sorted(steps)


def _plant(checkpoints: Path, complete: list[int]) -> str:
    """A checkpoint cut short after the newest whole one: its shards copied, no .metadata, no marker."""
    newest = checkpoints / f"step_{complete[-1]:06d}"
    planted = checkpoints / f"step_{complete[-1] + 2 * SAVE_EVERY:06d}"
    planted.mkdir(exist_ok=True)
    for shard in newest.glob("*.distcp"):
        shutil.copyfile(shard, planted / shard.name)
    return planted.name


def _sample_cpu(recovery: Recovery, pid: int) -> None:
    import psutil

    try:
        used = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return  # gone: the samples so far stand
    recovery.cpu.append((time.time(), used.user + used.system))


def kill_and_restart(learner_dir: Path, seed: int, scratch: Path) -> Recovery:
    checkpoints, logs = scratch / "checkpoints", scratch / "logs"
    checkpoints.mkdir(), logs.mkdir()
    kwargs = {"checkpoint_dir": str(checkpoints), "log_dir": str(logs), "seed": seed, "steps": STEPS,
              "save_every": SAVE_EVERY, "step_seconds": STEP_SECONDS}
    kill_step = SAVE_EVERY * (2 + seed % 3) + 2  # between two saves, after at least two of them
    started = time.perf_counter()
    proc = start_ranks("elastic_train", "train", learner_dir=learner_dir, world_size=WORLD, kwargs=kwargs,
                       scratch=scratch, max_restarts=1)
    recovery = Recovery(run=None, seed=seed, kill_step=kill_step)  # type: ignore[arg-type]
    log = logs / "rank0.jsonl"
    deadline, old = time.time() + 90, set()
    while time.time() < deadline and proc.poll() is None:
        victim = rank_processes(proc).get(1) if any(line["step"] >= kill_step for line in _lines(log)) else None
        if victim is not None:
            old = set(rank_processes(proc).values())  # the killed world's ranks, the victim among them
            recovery.killed_at = time.time()
            os.kill(victim, signal.SIGKILL)
            recovery.complete_at_kill = _complete(checkpoints)
            if recovery.complete_at_kill:
                recovery.planted = _plant(checkpoints, recovery.complete_at_kill)
            break
        time.sleep(0.005)
    if not recovery.killed_at:
        recovery.note = (f"rank 0 never logged step {kill_step} in {log.name} while rank 1 was alive, so no rank "
                         "was killed")
    # the judge's clock of the restarted world: its processes (torchrun's agent tears the killed world down,
    # then starts new ranks), and rank 0's log as it grows; and the new rank 0's CPU seconds until it caught up
    fresh_rank0 = None
    while recovery.killed_at and time.time() < deadline and proc.poll() is None:
        if "new_ranks" not in recovery.seen:
            ranks = rank_processes(proc)
            live, now = set(ranks.values()), time.time()
            if "torn_down" not in recovery.seen and not live & old:
                recovery.seen["torn_down"] = now  # no rank of the killed world is left
            if len(live - old) >= WORLD:
                recovery.seen.setdefault("torn_down", now)
                recovery.seen["new_ranks"] = now  # torchrun has started every rank of the new world
                fresh_rank0 = ranks.get(0) if ranks.get(0) not in old else None
                if not any(line["restart"] >= 1 for line in _lines(log)):  # not stepped yet, so nothing saved
                    recovery.complete_at_restart = _complete(checkpoints)
        if fresh_rank0 is not None and "caught_up" not in recovery.seen:
            _sample_cpu(recovery, fresh_rank0)
        lines = _lines(log)
        reached = max((line["step"] for line in lines if line["restart"] == 0), default=kill_step)
        fresh = [line for line in lines if line["restart"] >= 1]
        if fresh and "first_step" not in recovery.seen:
            recovery.seen["first_step"] = time.time()
        if any(line["step"] >= reached for line in fresh) and "caught_up" not in recovery.seen:
            recovery.seen["caught_up"] = time.time()
            recovery.redone = next(i for i, line in enumerate(fresh, 1) if line["step"] >= reached)
            if fresh_rank0 is not None:
                _sample_cpu(recovery, fresh_rank0)
        time.sleep(0.005)
    recovery.run = collect(proc, scratch=scratch, world_size=WORLD, timeout_s=max(deadline - time.time(), 1),
                           started=started)
    recovery.seen["finished"] = time.time()
    recovery.lines = _lines(log)
    return recovery
