"""Week 2 performance: the learner's chosen configuration against the naive baseline, both measured by the
grader. The baseline is the course's own per-file loader (kit.data.course_file_loader), never the learner's
FileDataset: a slowed-down baseline cannot make a loader look fast. The batches CHOSEN's timed steps trained on
are checked against the dataset: a loader that is fast because it hands back the wrong data fails."""
import pytest

from infracourse.grader import LabCheckFailed
from infracourse.kit.data import ImageSet, dataset_batches


def check_trained_batches(digests, batch_size, what):
    """The timed steps trained on the dataset's batches 0, 1, 2, ... in order (a new epoch starts again at 0)."""
    spec = ImageSet()
    known = dataset_batches(spec, batch_size)
    expected = 0
    for i, digest in enumerate(digests):
        if digest is None:  # the loader ran out: a new epoch
            if expected != spec.samples // batch_size:
                raise LabCheckFailed(f"{what}: the epoch ended after {expected} batches; {spec.samples} samples "
                                     f"make {spec.samples // batch_size} full batches of {batch_size}")
            expected = 0
            continue
        got = known.get(digest)
        if got != expected:
            seen = "not one of the dataset's batches" if got is None else f"the dataset's batch {got}"
            raise LabCheckFailed(
                f"{what}: timed step {i} trained on {seen}, expected batch {expected} (samples "
                f"{expected * batch_size}..{(expected + 1) * batch_size - 1}, in order). The speed of a loader "
                "counts only if it delivers the data: read every batch, in dataset order, every time.")
        expected += 1


@pytest.mark.check("speedup")
def test_speedup(script, steady_step, lab_check, record):
    chosen = getattr(script, "CHOSEN", None)
    if not isinstance(chosen, dict) or set(chosen) != {"read", "batch_size", "workers"}:
        raise LabCheckFailed("benchmark.CHOSEN must be a dict with read, batch_size and workers: the configuration "
                             "your sweep found best on this machine")
    try:
        read, batch, workers = str(chosen["read"]), int(chosen["batch_size"]), int(chosen["workers"])
    except (TypeError, ValueError):
        raise LabCheckFailed(f"benchmark.CHOSEN = {chosen}: batch_size and workers must be whole numbers") from None
    if not 1 <= batch <= ImageSet().samples // 4 or not 0 <= workers <= 8:
        raise LabCheckFailed(f"CHOSEN = {chosen}: batch_size must be 1..{ImageSet().samples // 4} (at least four "
                             "batches an epoch) and workers 0..8")
    # The baseline reads one file per sample in the training process, at the same batch size: the gain must
    # come from the input pipeline, not from a larger batch. It is the course's loader, not the learner's.
    base_s, _ = steady_step("file", batch, 0, course=True)
    best_s, digests = steady_step(read, batch, workers)
    check_trained_batches(digests, batch, f"CHOSEN ({chosen})")
    base, best = batch / base_s, batch / best_s
    ratio = best / base
    record("chosen samples/s", best, unit="samples/s")
    record("course baseline samples/s", base, unit="samples/s")
    record("speedup over baseline", ratio, target=lab_check.threshold, unit="x")
    if ratio < lab_check.threshold:
        raise LabCheckFailed(
            f"CHOSEN ({chosen}) trains {best:.0f} samples/s; the course's per-file loader without workers at the "
            f"same batch size trains {base:.0f}/s: {ratio:.2f}x, the target is {lab_check.threshold:.1f}x. Look at "
            "data_ms in your sweep: read whole batches from the packed file, or hide the reads behind workers.")
