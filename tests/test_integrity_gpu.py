"""Grader integrity on a GPU: the defences only a device can show. Work launched on a side stream escapes
the CUDA events but not the device-wide wall clock; the caching allocator hands a data_ptr-keyed cache its
hits, which the sampled output checks catch; a result that skips the work beats the calibrated copy
bandwidth and fails the physics floor. Skipped without CUDA (the CPU half is test_integrity.py)."""
import pytest
import torch

from infracourse import bench
from infracourse.compare import assert_close
from infracourse.failures import LabCheckFailed
from infracourse.grading import perf
from infracourse.grading.inputs import tensors

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

N = 1 << 26  # 256 MiB of fp32: about 0.1 ms per pass at 4 TB/s, far above launch overhead

LEARNER = """
import torch

hits = []
_cache = {}
_done = []


def double(x):
    return x * 2


def hide(x):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the input was made on the current stream
    with torch.cuda.stream(side):
        y = x * 2
        for _ in range(3):
            y = y * 1.0  # a few more passes: clearly more than the 20 us the escape test forgives
    return y  # returned without the current stream waiting for it


def cached_double(x):
    key = x.data_ptr()
    if key in _cache:
        hits.append(key)
        return _cache[key]
    return _cache.setdefault(key, x * 2)


def cache_hits():
    return len(hits)


def skipped(x):  # returns a buffer without touching 512 MiB; a check that cannot tell lets it through
    if not _done:
        _done.append(torch.empty_like(x))
    return _done[0]
"""


def _fresh():
    return (torch.randn(N, device="cuda"),)


def _inputs(seed: int = 0):
    return tensors([[N]], device="cuda", seed=seed)


def _check_double(out, args):
    assert_close(out, args[0].double() * 2, what="a timed x * 2")


@pytest.fixture(scope="module")
def ceilings():
    from infracourse.hardware import calibrate, detect

    return calibrate(detect())


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """The learner's functions in a grading worker on the GPU, as graders time them."""
    from infracourse.grading.remote import WorkerClient

    folder = tmp_path_factory.mktemp("integrity-gpu") / "learner"
    folder.mkdir()
    (folder / "doubles.py").write_text(LEARNER)
    worker = WorkerClient(folder, gpu=True)
    try:
        yield worker.module("doubles")
    finally:
        worker.close()


def test_an_honest_kernel_is_neither_escaped_nor_impossible(learner, ceilings):
    timing = perf.timed(learner.double, _inputs(), check=_check_double, bytes_moved=2 * N * 4, ceilings=ceilings)
    assert not timing.escaped
    assert timing.wall_per_call_s is not None and timing.seconds >= timing.median_s


def _side_stream_double():
    """The learner's side-stream double, run here in the judge's process (bench.measure's own view of it)."""
    namespace: dict = {}
    exec(LEARNER, namespace)
    return namespace["hide"]


def test_a_side_stream_launch_escapes_the_events_but_not_the_wall_clock():
    timing = bench.measure(_side_stream_double(), make_args=_fresh, check=_check_double)
    assert timing.escaped, timing.as_dict()
    assert timing.seconds == timing.wall_per_call_s  # the figure graders use is the device-wide one


def test_timed_fails_a_side_stream_launch(learner):
    with pytest.raises(LabCheckFailed, match="ran outside the timed stream"):
        perf.timed(learner.hide, _inputs(1), check=_check_double)


def test_an_output_cache_keyed_by_data_ptr_is_caught_with_the_caching_allocator(learner):
    with pytest.raises(LabCheckFailed, match="out of tolerance"):
        perf.timed(learner.cached_double, _inputs(2), check=_check_double)
    assert learner.cache_hits(), "the caching allocator never reused an address: this test proved nothing"


def test_a_result_that_skips_the_work_is_faster_than_physics(learner, ceilings):
    with pytest.raises(LabCheckFailed, match="did not do the work"):
        perf.timed(learner.skipped, _inputs(3), check=lambda out, args: None, bytes_moved=2 * N * 4,
                   ceilings=ceilings)
