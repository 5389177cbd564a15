"""Week 19 streaming memory: an epoch of a 96 MiB dataset (kit.datapipe.STREAM: 32 shards of 3 MiB) through the
learner's pipeline with a prefetcher, in a process whose data segment may grow by only BUDGET over what the
interpreter, NumPy and the learner's imports already hold, with a pause after the first batch (and a short
step after each other) that lets a prefetcher run as far ahead as it is allowed to.

Why RLIMIT_DATA and not RLIMIT_AS: glibc reserves 64 MiB of address space for each new thread's malloc arena
and 8 MiB for its stack, so one prefetch thread adds about 73 MiB of address space (measured: VmSize 138 ->
211 MiB) but only about 9 MiB of data (VmData 89 -> 98 MiB). An address-space cap would punish having a thread,
not holding data; RLIMIT_DATA counts private writable memory (the heap and anonymous mappings, which is where
shard bytes and batches live; Linux 4.7+), and MALLOC_ARENA_MAX=2 keeps the reservations few."""
import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.datapipe import PREFETCH, STREAM
from week19_judging import Built, check_manifest

BUDGET = 48 * 2 ** 20
PAUSE_S = 1.5  # after the first batch
STEP_S = 0.005  # after each other batch


@pytest.fixture(scope="session")
def stream_built(harness):
    root = harness.copy(STREAM, "stream")
    with harness.storage(root) as server:
        run = harness.run(server, STREAM, {"task": "manifest"}, "build_manifest on the 96 MiB dataset")
    return Built(root, check_manifest(run.results("manifest")[0]["manifest"], STREAM, root, "build_manifest"))


@pytest.mark.check("stream-memory")
def test_streaming_stays_under_the_cap(harness, stream_built, record):
    total = len(STREAM.reference_ids())
    cfg = dict(batch_size=16, seed=0, prefetch=PREFETCH)
    what = (f"an epoch of make_pipeline({cfg}) over {STREAM.shards} shards of 3 MiB (96 MiB) with a cap of "
            f"{BUDGET >> 20} MiB of data above the process's start")
    with harness.storage(stream_built.root) as server:
        run = harness.run(server, STREAM, {"task": "stream", "manifest": stream_built.manifest, "cfg": cfg,
                                           "budget_bytes": BUDGET, "pause_s": PAUSE_S,
                                           "step_s": STEP_S}, what, timeout_s=60)
    line = (run.results("samples") or [{}])[0]
    if line.get("memory_error"):
        raise LabCheckFailed(
            f"{what}: MemoryError after {line['samples']} samples. Streaming holds a bounded amount: the shard "
            f"being read and at most `prefetch` ({PREFETCH}) batches waiting (queue.Queue(maxsize=...)); reading "
            "shards ahead without a bound, or the whole dataset before the first batch, does not fit")
    if line.get("samples") != total:
        raise LabCheckFailed(f"{what}: the epoch handed out {line.get('samples')} samples of {total}")
    # what was measured is not what was capped: name both, with the allowance really enforced (the data segment
    # at the start, the interpreter's and imports', plus BUDGET), so 54 MiB resident never reads as over 48 MiB
    record("peak resident memory, whole process", line["peak_rss_bytes"] / 2 ** 20, unit="MiB")
    record(f"data segment cap enforced (start {line['base_bytes'] / 2 ** 20:.0f} MiB + {BUDGET >> 20} MiB)",
           (line["base_bytes"] + BUDGET) / 2 ** 20, unit="MiB")
