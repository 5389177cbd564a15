"""The NVIDIA track's project (weeks 22-24): what one operator costs inside a training step of the course GPT,
and what making it faster can and cannot change.

Course code, frozen: the judge measures with it, and a learner's run.py may use it too (the same sizes, the
same way of counting). Learner code never runs in the judge: the learner's norm is timed and counted in the
grading worker (kit.probes), and what comes back is evidence the judge checks against its own measurement.

    size = project_size("cpu")                      # the GPT, batch and dtype the project measures on a device
    share = hotspot_share(op_s, step_s, size)       # norms per step x one norm's forward + backward / step
    amdahl_bound(share, speedup)                    # the best step speed-up an operator speed-up allows
    counts_of(record)                               # kernel launches and copies a watched call made
    counted_flops(model, idx, targets)              # the FLOPs torch counts in one training step
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch

from infracourse.observe import op_effect, watch_call
from infracourse.kit.gpt import GPTConfig, RMSNorm

EPS = 1e-6


@dataclass(frozen=True)
class ProjectSize:
    """The model, batch and dtype the project measures on one kind of device."""

    config: GPTConfig
    batch: int
    dtype: torch.dtype

    @property
    def tokens(self) -> int:
        return self.batch * self.config.seq_len

    @property
    def norm_shape(self) -> tuple[int, int]:
        """(rows, hidden) of one norm's activation in a step."""
        return self.tokens, self.config.d_model

    @property
    def norms_per_step(self) -> int:
        return 2 * self.config.n_layer + 1  # two per block and the final one

    def describe(self) -> dict[str, Any]:
        return {**asdict(self.config), "batch": self.batch, "dtype": str(self.dtype).removeprefix("torch.")}


# CPU: small enough that a step takes milliseconds on two shared cores. CUDA: week 10's end-to-end model,
# big enough that a step is not pure launch overhead.
SIZES = {
    "cpu": ProjectSize(GPTConfig(vocab_size=256, seq_len=64, d_model=128, n_head=4, n_layer=2), 4, torch.float32),
    "cuda": ProjectSize(GPTConfig(vocab_size=256, seq_len=1024, d_model=1024, n_head=16, n_layer=4), 8,
                        torch.bfloat16),
}


def project_size(device: str) -> ProjectSize:
    return SIZES["cuda" if str(device).startswith("cuda") else "cpu"]


def timing_threads(device: str) -> int:
    """One intra-op thread on a CPU, for every timing of the project (the judge's, the worker's and run.py's):
    on a few cores shared with other work, an op split over threads waits for whichever thread is descheduled,
    and a 0.2 ms norm then takes 20 ms. A GPU's timings are left as they are. Returns the threads now used."""
    if not str(device).startswith("cuda"):
        torch.set_num_threads(1)
    return torch.get_num_threads()


def timed_seconds(timing) -> float:
    """The figure the project compares, from a bench.Timing: on a GPU its `seconds` (never less than the
    device-wide clock saw); on a CPU the fastest tenth of its calls (p10)."""
    return timing.seconds if timing.device != "cpu" else timing.p10_s


def thread_seconds(fn: Callable, *args) -> float:
    """CPU seconds this thread spent in one fn(*args) (see cpu_seconds_per_call for why this thread's clock)."""
    import time

    start = time.thread_time()
    fn(*args)
    return time.thread_time() - start


def cpu_seconds_per_call(fn: Callable, args: tuple, calls: int, rounds: int = 5) -> float:
    """CPU seconds of one fn(*args) on this thread (time.thread_time), the least over `rounds` rounds of
    `calls` calls after one warm-up round: on a CPU shared with other work the CPU time a call takes is what
    it costs, where a wall clock also counts the time other processes held the core. The calling thread's
    clock, not the process's: with one intra-op thread (timing_threads) the op runs here, and the process
    clock would also count whatever other threads of this process do meanwhile (a spinning OpenMP pool, a
    reader thread)."""
    return _least_rounds([(Repeat(fn, calls), args)], rounds)[0]


def _least_rounds(repeats: list[tuple["Repeat", tuple]], rounds: int) -> list[float]:
    """Seconds of one call of each Repeat, on this thread's clock: a round of each in turn, `rounds` times after
    a warm-up round, each keeping its least round."""
    best = [float("inf")] * len(repeats)
    for round_ in range(rounds + 1):
        for i, (repeat, args) in enumerate(repeats):
            spent = thread_seconds(repeat, *args)
            if round_:
                best[i] = min(best[i], spent / repeat.calls)
    return best


ROUND_S = 0.15  # CPU seconds of one round of timed calls on a CPU


def calls_per_round(estimate_s: float) -> int:
    """Calls of a CPU round of ROUND_S, for calls of about `estimate_s` seconds each."""
    return max(2, int(ROUND_S / max(estimate_s, 1e-6)))


def cpu_seconds_in_turns(*timed: tuple[Callable, tuple], rounds: int = 5) -> list[float]:
    """CPU seconds of one call of each (fn, args), as cpu_seconds_per_call measures it, but in turns: a round
    of each, `rounds` times after a warm-up round, each keeping its least round. For figures that are a ratio
    of two timings (a speed-up, a share): measured in separate windows, the same unfused norm's CPU seconds
    moved by 2x between runs on one idle 2-core machine (0.24 to 0.47 ms), while rounds taken in turn share
    the conditions of the moment (cache, frequency, the other hyperthread's work)."""
    sized = [(Repeat(fn, calls_per_round(cpu_seconds_per_call(fn, args, 1, rounds=1))), args) for fn, args in timed]
    return _least_rounds(sized, rounds)


class Repeat:
    """fn(*args) `calls` times in one call, returning the last output: built in the grading worker around a
    learner's callable, so the judge can read the worker's CPU seconds (kernel accounting) around many calls
    and one round trip. With `inputs` (a course input generator, grading.inputs) the calls cycle through
    DISTINCT inputs drawn from it when built, instead of the arguments given: an operator cannot answer from a
    cache of the last input; `last_input(calls)` names the input of the last call, which the judge draws too."""

    DISTINCT = 32

    def __init__(self, fn: Callable, calls: int, inputs=None):
        self.fn, self.calls = fn, calls
        self.inputs = []
        if inputs is not None:  # a generator index -> args (the worker builds it from the judge's spec)
            self.inputs = [inputs(i) for i in range(min(calls, self.DISTINCT))]

    @classmethod
    def last_input(cls, calls: int) -> int:
        """The generator index of the last call's input, with `inputs`."""
        return (calls - 1) % min(calls, cls.DISTINCT)

    def __call__(self, *args):
        for call in range(self.calls):
            out = self.fn(*(self.inputs[call % len(self.inputs)] if self.inputs else args))
        return out


def unfused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The course GPT's own norm (kit.gpt.RMSNorm without a norm_fn: upcast, five ops, downcast), as a function
    of (x, weight, eps): the baseline every operator is compared with. RMSNorm.forward itself runs, on a stand-in
    for the module that holds only what it reads (no module built, no weight copied per call)."""
    return RMSNorm.forward(SimpleNamespace(norm_fn=None, eps=eps, weight=weight), x)


def hotspot_share(norm_seconds: float, step_seconds: float, size: ProjectSize) -> float:
    """The norm's share of a step: its forward + backward time at the model's shape, times the norms a step
    runs, over the whole step's time (at most 1)."""
    return min(size.norms_per_step * norm_seconds / step_seconds, 1.0)


def amdahl_bound(share: float, speedup: float) -> float:
    """1 / ((1 - s) + s / k): the step speed-up when only the share s of it gets k times faster."""
    return 1.0 / ((1.0 - share) + share / speedup)


# ---------------------------------------------------------------- launches and copies
COPY_OPS = frozenset({"copy_", "_to_copy", "clone", "_copy_from", "_copy_from_and_resize", "contiguous",
                      "_reshape_copy"})


@dataclass(frozen=True)
class Counts:
    """What a watched call made: kernel launches (torch compute ops dispatched, each one or more kernels on a
    GPU, plus Triton launches) and copies (dtype casts, clones, .contiguous())."""

    launches: int
    copies: int


def counts_of(record) -> Counts:
    """Counts of a observe.CallRecord (a call watched by observe.watch_call, here or in the worker)."""
    copies = sum(op in COPY_OPS for op in record.ops)
    computes = sum(op_effect(op) == "compute" for op in record.ops)
    return Counts(launches=computes + copies + len(record.kernels), copies=copies)


def count_call(fn: Callable, *args) -> Counts:
    """Launches and copies of fn(*args) run here (course code only: the judge's baseline, a learner's run)."""
    with watch_call(poison=False, inputs=args) as record:
        fn(*args)
    return counts_of(record)


# ---------------------------------------------------------------- model FLOPs and MFU
# (the reference formula of the MFU estimate is the judge's, graders/track-nvidia/track_nvidia_judging.py: here,
# mounted for run.py, an estimates.py could return it as its own)
def counted_flops(model: torch.nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> tuple[int, bool]:
    """(FLOPs torch's FlopCounterMode counts in one forward + backward, whether attention was among them).

    Flash attention for CPU has no flop formula in torch: there only the matmuls are counted."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        _, loss = model(idx, targets)
        loss.backward()
    model.zero_grad(set_to_none=True)
    ops = {str(op) for op in counter.get_flop_counts().get("Global", {})}
    return counter.get_total_flops(), any("attention" in op for op in ops)


def cpu_matmul_tflops(size: int = 512) -> float:
    """The fp32 torch.mm rate of this CPU, TFLOP/s, by the CPU seconds of a call (cpu_seconds_per_call, on the
    threads set by timing_threads): the CPU's stand-in for a GPU's calibrated matmul ceiling."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / cpu_seconds_per_call(torch.mm, (a, b), calls=20) / 1e12
