"""Week 2 performance: the learner's chosen configuration against the naive baseline, measured by the grader."""
import pytest

from infracourse.guard import LabCheckFailed


@pytest.mark.check("speedup")
def test_speedup(script, steady_step, lab_check, record):
    chosen = getattr(script, "CHOSEN", None)
    if not isinstance(chosen, dict) or set(chosen) != {"read", "batch_size", "workers"}:
        raise LabCheckFailed("benchmark.CHOSEN must be a dict with read, batch_size and workers: the configuration "
                             "your sweep found best on this machine")
    batch = int(chosen["batch_size"])
    # The baseline reads one file per sample in the training process, at the same batch size: the gain must
    # come from the input pipeline, not from a larger batch.
    base = batch / steady_step("file", batch, 0)
    best = batch / steady_step(chosen["read"], batch, int(chosen["workers"]))
    ratio = best / base
    record("chosen samples/s", best, unit="samples/s")
    record("speedup over baseline", ratio, target=lab_check.threshold, unit="x")
    if ratio < lab_check.threshold:
        raise LabCheckFailed(
            f"CHOSEN ({chosen}) trains {best:.0f} samples/s; per-file reads without workers at the same batch size "
            f"train {base:.0f}/s: {ratio:.2f}x, the target is {lab_check.threshold:.1f}x. Look at data_ms in your "
            "sweep: read whole batches from the packed file, or hide the reads behind workers.")
