"""The shared judging helpers of the week12 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from infracourse.grader import LabCheckFailed, RanksRun, run_ranks
from infracourse.kit.ddp_reference import (LR, MOMENTUM, global_batch_indices, loss_fn, make_dataset,
                                           make_model)


KIT = "infracourse.kit.ddp_reference"
STEPS, PER_RANK, SAMPLES = 6, 4, 72          # the equivalence runs: global batch 24, 3 steps an epoch, 2 epochs
GLOBAL_BATCH = 24
TINY_BUCKET_MB = 0.01                        # ~10 KB buckets: the MLP's gradients split into several
TIMED_STEPS, TIMED_SAMPLES = 80, 40960       # the scaling runs: per-rank 256 (weak) and global 512 (strong)
WEAK_PER_RANK, STRONG_GLOBAL = 256, 512


@dataclass
class World:
    size: int
    run: RanksRun
    experiments: dict[str, dict]  # name -> its config
    checkpoint_dir: Path

    def results(self, name: str) -> list[dict]:
        """Per rank, what run_experiments saw for the named experiment."""
        failure = self.run.failure()
        if failure:
            raise LabCheckFailed(f"the world of {self.size} rank(s) failed, so this cannot be checked: "
                                 f"{_teach(failure)}")
        index = list(self.experiments).index(name)
        for rank, out in enumerate(self.run.outputs):
            raised = experiment_error(out)
            if raised is not None and raised[0] <= index:
                first = list(self.experiments)[raised[0]]
                ran = "" if first == name else f" (so {name!r}, which runs after it, did not run)"
                raise LabCheckFailed(f"rank {rank}: train() raised in the run {first!r} ({self.describe(first)})"
                                     f"{ran}: {_teach(raised[1])}")
        return [out[index] for out in self.run.outputs]

    def describe(self, name: str) -> str:
        c = self.experiments[name]
        mode = "" if c.get("overlap", True) else ", overlap=False"
        return (f"world {self.size}, per_rank_batch {c['per_rank_batch']}, accumulation {c['accumulation']}, "
                f"bucket_cap_mb {c.get('bucket_cap_mb', 25.0)}{mode}, samples {c['samples']}, seed {c['seed']}")


def experiment_error(out: list[dict]) -> tuple[int, str] | None:
    """(index, traceback) of the experiment that raised in one rank's run_experiments list, or None."""
    for index, result in enumerate(out):
        if "error" in result:
            return index, str(result["error"])
    return None


def _teach(failure: str) -> str:
    if "NotImplementedError" in failure:
        return "train() is not written yet (it raised NotImplementedError): write train_ddp.train as the handout says"
    return failure[-1800:]


def launch_world(learner, scratch: Path, size: int, experiments: dict[str, dict], device: str) -> World:
    checkpoint_dir = scratch / "checkpoint"
    checkpoint_dir.mkdir(parents=True)
    for config in experiments.values():
        if config.pop("checkpoint", False):
            config["checkpoint_dir"] = str(checkpoint_dir)
    run = run_ranks(KIT, "run_experiments", learner_dir=learner.root, world_size=size,
                    kwargs={"experiments": list(experiments.values())}, device=device, probe=KIT,
                    timeout_s=120, scratch=scratch)
    return World(size, run, experiments, checkpoint_dir)


def main_experiment(accumulation: int, seed: int, **extra) -> dict:
    return dict(steps=STEPS, per_rank_batch=PER_RANK, accumulation=accumulation, samples=SAMPLES, seed=seed, **extra)


def timed_experiment(per_rank: int, seed: int, **extra) -> dict:
    return dict(steps=TIMED_STEPS, per_rank_batch=per_rank, accumulation=1, samples=TIMED_SAMPLES, seed=seed,
                **extra)


@dataclass
class Launches:
    seed: int
    peak_flops: float  # this machine's calibrated one-thread fp32 matmul rate, measured by the judge
    one: World
    two: World


def step_gaps(result: dict) -> list[float]:
    """The course's clock of one rank's run: the times between the ends of consecutive optimiser steps."""
    ends = result["step_ends"]
    if len(ends) < 3:
        raise LabCheckFailed(f"the course saw {len(ends)} optimiser steps in a timed run of {TIMED_STEPS}: use "
                             "the kit's make_optimizer and call its step() once per optimiser step")
    return sorted(b - a for a, b in zip(ends, ends[1:]))


def course_step_s(result: dict) -> float:
    """The fastest step of the run: on a shared machine other processes only ever add time to a step, so the
    least disturbed one is what this configuration costs (and it is what agrees from one grade to the next)."""
    return step_gaps(result)[0]


ATOL, RTOL = 1e-5, 1e-4  # float32: the pieces of a global batch are summed in another order


def params_difference(params, expected: dict) -> str | None:
    """Where the learner's final weights differ from `expected`, or None."""
    if not isinstance(params, dict) or set(params) != set(expected):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        return f"'params' must be the unwrapped model's state_dict (keys {sorted(expected)}), got {got}"
    for name, want in expected.items():
        got = params[name]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return f"params[{name!r}] is not a tensor of shape {tuple(want.shape)}"
        if not torch.allclose(got.float().cpu(), want, atol=ATOL, rtol=RTOL):
            return (f"params[{name!r}] differs by up to {(got.float().cpu() - want).abs().max().item():.3g} "
                    f"(allowed {ATOL:g} + {RTOL:g} relative)")
    return None


# The single-process reference lives here, beside the graders, not in kit.ddp_reference: that module is mounted
# for the ranks (train_ddp imports its model and data), and a train() that returned the judge's own weights
# would have hidden a DDP that averages wrongly.
def reference_train(steps: int, global_batch: int, samples: int, seed: int = 0) -> tuple[dict, list[float]]:
    """One process, batch = the global batch: final weights and the loss before each step."""
    data, model = make_dataset(samples, seed), make_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(steps):
        idx = global_batch_indices(step, global_batch, samples, seed)
        loss = loss_fn(model(data.x[idx]), data.y[idx])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses
