"""Week 22's baseline: one FIFO (the course service alone) under a batch flood. The learner's raw/baseline.json
(interactive requests' raw records, kit.loadgen.write_records) must reproduce what the judge measures when it
runs the same workload against the course service itself."""
import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.loadgen import compute_metrics, read_records
from track_platform_judging import FIFO_BATCH, FIFO_INTERACTIVE, FIFO_RATE

FACTOR, ABSOLUTE_MS = 2.0, 300.0


@pytest.mark.check("fifo-baseline")
def test_fifo_baseline_reproduced(fifo, learner, record):
    judge = fifo.get()["metrics"]
    path = learner.path("raw/baseline.json")
    if not path.exists():
        raise LabCheckFailed("raw/baseline.json is missing: your run command measures the baseline first (the "
                             f"course service alone, one FIFO: {FIFO_BATCH} batch requests at once, then "
                             f"{FIFO_INTERACTIVE} interactive at {FIFO_RATE:g}/s) and writes the interactive "
                             "requests' records with kit.loadgen.write_records")
    try:
        records, duration, conditions = read_records(path)
    except ValueError as exc:
        raise LabCheckFailed(f"raw/baseline.json is not kit.loadgen.write_records' format: {exc}") from None
    mine = compute_metrics(records, duration, percentiles=(50, 99))
    if mine["completed"] < len(records) or len(records) < FIFO_INTERACTIVE:
        raise LabCheckFailed(f"raw/baseline.json holds {len(records)} interactive records, {mine['completed']} of "
                             f"them successful; the baseline needs {FIFO_INTERACTIVE} that all succeeded (a FIFO "
                             "is slow, not failing)")
    p99, theirs = judge["ttft_ms"]["p99"], mine["ttft_ms"]["p99"]
    record("fifo ttft p99", p99, unit="ms")
    record("your fifo ttft p99", theirs, unit="ms")
    if not (p99 / FACTOR - ABSOLUTE_MS <= theirs <= p99 * FACTOR + ABSOLUTE_MS):
        raise LabCheckFailed(
            f"your baseline's interactive P99 TTFT (recomputed from raw/baseline.json's records) is {theirs:.0f} ms; "
            f"the judge ran the same workload against the course service alone and measured {p99:.0f} ms (within "
            f"{FACTOR:g}x +- {ABSOLUTE_MS:g} ms expected). Measure the baseline as the handout states: the course "
            f"service started alone, {FIFO_BATCH} batch requests at once and 0.3 s later {FIFO_INTERACTIVE} "
            f"interactive requests at {FIFO_RATE:g}/s (gamma, burstiness 20), TTFT of the interactive ones")
