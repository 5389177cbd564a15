"""The shared judging helpers of the week02 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from dataclasses import dataclass, field
import psutil


# The reduced sweep the grader re-runs: every read method and worker setting at two batch sizes, 32 (the
# report's baseline) and one drawn from the run's seed.
SECOND_BATCH = (48, 64, 80, 96, 112, 128)
BASELINE = ("file", 32, 0)


@dataclass(frozen=True)
class Plan:
    """What this run asks for, drawn from the seed: the sweep's second batch size, the batch size readers are
    checked with (rarely a divisor of the dataset, so a last partial batch must be dropped), and the packed
    probe's batch size."""

    seed: int
    batch: int
    readers_batch: int
    probe_batch: int

    @property
    def configs(self) -> list[dict]:
        return [{"read": read, "batch_size": batch, "workers": workers}
                for read in ("file", "packed") for batch in (32, self.batch) for workers in (0, 2)]


@dataclass
class Sweep:
    """The learner's sweep() over the plan's configurations: the rows read back from the CSV it wrote (the
    deliverable), and the steps the stamped trainer saw, one list per trainer made (runs[i] should be config i)."""

    configs: list
    warmup: int = 2
    steps: int = 8
    rows: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    worker_rss_mb: float = 0.0  # the training process's resident memory, read by the grader after the sweep


def process_rss_mb(pid: int) -> float:
    """The largest resident memory (MiB) among a process and its descendants: for the grading worker, the
    Python process that ran the learner's training (the sandbox's launcher is tiny)."""
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0.0
    sizes = []
    for proc in procs:
        try:
            sizes.append(proc.memory_info().rss)
        except psutil.Error:
            continue
    return max(sizes, default=0) / 2**20
