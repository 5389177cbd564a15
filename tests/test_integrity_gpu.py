"""Grader integrity on a GPU: the defences only a device can show. Work launched on a side stream escapes
the CUDA events but not the device-wide wall clock; the caching allocator hands a data_ptr-keyed cache its
hits, which the sampled output checks catch; a result that skips the work beats the calibrated copy
bandwidth and fails the physics floor. Skipped without CUDA (the CPU half is test_integrity.py)."""
import pytest
import torch

from infracourse import bench
from infracourse.compare import assert_close
from infracourse.grading import perf
from infracourse.guard import LabCheckFailed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

N = 1 << 26  # 256 MiB of fp32: about 0.1 ms per pass at 4 TB/s, far above launch overhead


def _fresh():
    return (torch.randn(N, device="cuda"),)


def _check_double(out, args):
    assert_close(out, args[0].double() * 2, what="a timed x * 2")


@pytest.fixture(scope="module")
def ceilings():
    from infracourse.hardware import calibrate, detect

    return calibrate(detect())


def test_an_honest_kernel_is_neither_escaped_nor_impossible(ceilings):
    timing = perf.timed(lambda x: x * 2, _fresh, check=_check_double, bytes_moved=2 * N * 4, ceilings=ceilings)
    assert not timing.escaped
    assert timing.wall_per_call_s is not None and timing.seconds >= timing.median_s


def _side_stream_double():
    side = torch.cuda.Stream()

    def hide(x):
        side.wait_stream(torch.cuda.current_stream())  # the input was made on the current stream
        with torch.cuda.stream(side):
            y = x * 2
            for _ in range(3):
                y = y * 1.0  # a few more passes: clearly more than the 20 us the escape test forgives
        return y  # returned without the current stream waiting for it

    return hide


def test_a_side_stream_launch_escapes_the_events_but_not_the_wall_clock():
    timing = bench.measure(_side_stream_double(), make_args=_fresh, check=_check_double)
    assert timing.escaped, timing.as_dict()
    assert timing.seconds == timing.wall_per_call_s  # the figure graders use is the device-wide one


def test_timed_fails_a_side_stream_launch():
    with pytest.raises(LabCheckFailed, match="ran outside the timed stream"):
        perf.timed(_side_stream_double(), _fresh, check=_check_double)


def test_an_output_cache_keyed_by_data_ptr_is_caught_with_the_caching_allocator():
    cache, hits = {}, []

    def cached_double(x):
        key = x.data_ptr()
        if key in cache:
            hits.append(key)
            return cache[key]
        return cache.setdefault(key, x * 2)

    with pytest.raises(LabCheckFailed, match="out of tolerance"):
        perf.timed(cached_double, _fresh, check=_check_double)
    assert hits, "the caching allocator never reused an address: this test proved nothing"


def test_a_result_that_skips_the_work_is_faster_than_physics(ceilings):
    done = torch.empty(N, device="cuda")

    def skipped(x):  # returns a buffer without touching 512 MiB; a check that cannot tell lets it through
        return done

    with pytest.raises(LabCheckFailed, match="did not do the work"):
        perf.timed(skipped, _fresh, check=lambda out, args: None, bytes_moved=2 * N * 4, ceilings=ceilings)
