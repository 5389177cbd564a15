"""The clocked batch: how many calls it clocks and how long the device is held first (bench.clocked_batch, the
one rule of the judge's clock of a worker and of bench.measure's own batch)."""
import pytest

from infracourse.grading.perf import HOLD_FACTOR, HOLD_S, MAX_HOLD_S, clocked_batch


def test_a_cpu_batch_or_an_instant_launch_is_clocked_whole_with_the_minimum_hold():
    assert clocked_batch(48, 0.0) == (48, HOLD_S)
    assert clocked_batch(48, -1.0) == (48, HOLD_S)  # a negative report is no credit


def test_a_kernel_launch_is_covered_by_the_hold_for_the_whole_batch():
    calls, hold = clocked_batch(48, 30e-6)
    assert calls == 48 and hold == pytest.approx(HOLD_S + HOLD_FACTOR * 48 * 30e-6)


@pytest.mark.parametrize("host_s", [2e-3, 4e-3, 12e-3])
def test_a_slow_to_launch_call_is_clocked_fewer_times_so_the_hold_still_covers_its_launches(host_s):
    calls, hold = clocked_batch(48, host_s)
    assert 2 <= calls < 48
    assert 2 * calls * host_s <= hold <= MAX_HOLD_S  # twice the launches at least, the factor where it fits
    assert hold == pytest.approx(min(HOLD_S + HOLD_FACTOR * calls * host_s, MAX_HOLD_S))


def test_an_absurd_host_time_gets_no_more_than_the_maximum_hold():
    calls, hold = clocked_batch(48, 10.0)
    assert calls == 2 and hold == MAX_HOLD_S


def _worker_with(tmp_path, source: str):
    from infracourse.grading.remote import WorkerClient

    folder = tmp_path / "learner"
    folder.mkdir()
    (folder / "mod.py").write_text(source)
    return WorkerClient(folder, gpu=False)


def test_timed_through_the_worker_checks_outputs_of_the_clocked_calls(tmp_path):
    import torch

    from infracourse.grading import perf
    from infracourse.grading.inputs import tensors

    worker = _worker_with(tmp_path, "def add(x, y):\n    return x + y\n")
    checked = []

    def check(out, args):
        checked.append(out.shape)
        torch.testing.assert_close(out, args[0] + args[1])

    try:
        timing = perf.timed(worker.module("mod").add, tensors([[1000], [1000]], device="cpu", seed=3),
                            check=check, label="add", calls=8)
    finally:
        worker.close()
    assert timing.median_s > 0 and timing.wall_per_call_s is not None and 1 <= len(checked) <= 3


PRECOMPUTING_ADD = """
answers = {}   # every output this process ever computed, by its inputs' bytes
clocked = []   # for each call: had its inputs been seen before?


def add(x, y):
    key = (x.numpy().tobytes(), y.numpy().tobytes())
    clocked.append(key in answers)
    if key not in answers:
        answers[key] = x + y
    return answers[key]


def seen_before():
    return [int(hit) for hit in clocked]
"""


def test_the_clocked_batchs_inputs_exist_only_once_the_judges_clock_runs(tmp_path):
    """A learner who computes outputs ahead (in the untimed passes) and only looks them up while the judge's
    clock runs would look as fast as a lookup. The batch's inputs are drawn from a salt the judge sends with the
    clocked request, so none of them was ever seen before: every clocked call computes."""
    import torch

    from infracourse.grading import perf
    from infracourse.grading.inputs import tensors

    worker = _worker_with(tmp_path, PRECOMPUTING_ADD)
    checked = []

    def check(out, args):
        checked.append(1)
        torch.testing.assert_close(out, args[0] + args[1])

    try:
        module = worker.module("mod")
        perf.timed(module.add, tensors([[256], [256]], device="cpu", seed=5), check=check, label="add", calls=6)
        hits = module.seen_before()
    finally:
        worker.close()
    clocked = hits[-6:]  # the clocked batch is the last 6 calls (a CPU batch is clocked once)
    assert clocked == [0] * 6 and checked  # none of its inputs existed before, and its outputs were checked
    assert sum(hits[:-6]) == 0  # nor did the watched pass reuse the samples' inputs


def test_timed_through_the_worker_fails_when_the_clocked_calls_are_wrong(tmp_path):
    import torch

    from infracourse.grading import perf
    from infracourse.grading.inputs import tensors
    from infracourse.failures import LabCheckFailed

    # right for its first calls (what a grader checking only a warm-up call would see), wrong afterwards
    worker = _worker_with(tmp_path, "calls = 0\n"
                                    "def add(x, y):\n"
                                    "    global calls\n"
                                    "    calls += 1\n"
                                    "    return x + y if calls <= 3 else x * 0\n")

    def check(out, args):
        if not torch.allclose(out, args[0] + args[1]):
            raise LabCheckFailed("a timed output is wrong")

    try:
        with pytest.raises(LabCheckFailed, match="timed output is wrong"):
            perf.timed(worker.module("mod").add, tensors([[64], [64]], device="cpu", seed=1), check=check,
                       label="add", calls=4)
    finally:
        worker.close()


ADD_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _copy(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)
'''


@pytest.mark.parametrize("body, passes", [
    # honest: the wrapper copies its inputs (.contiguous() of a transposed view, a cast) before the kernel
    ("    a, b = x.mT.contiguous().mT.contiguous(), y.float().to(y.dtype)\n"
     "    out = torch.empty_like(a)\n"
     "    _add[(triton.cdiv(a.numel(), 64),)](a, b, out, a.numel(), BLOCK=64)\n"
     "    return out\n", True),
    # honest: the kernel writes a wider buffer, returned cast to the inputs' dtype (a copy no kernel was given, as
    # week 10's dw accumulated in fp32 and returned .to(bf16), which autograd's CUDA thread makes unseen)
    ("    wide = torch.empty(x.shape, dtype=torch.float64)\n"
     "    _add[(triton.cdiv(x.numel(), 64),)](x, y, wide, x.numel(), BLOCK=64)\n"
     "    return wide.to(x.dtype)\n", True),
    # not: torch computes the answer, the kernel only copies it into the output
    ("    s = x + y\n"
     "    out = torch.empty_like(s)\n"
     "    _copy[(triton.cdiv(s.numel(), 64),)](s, out, s.numel(), BLOCK=64)\n"
     "    return out\n", False),
])
def test_clocked_calls_follow_the_wrappers_copies_but_not_a_result_computed_another_way(tmp_path, body, passes):
    import torch

    from infracourse.grading import perf
    from infracourse.grading.inputs import tensors
    from infracourse.failures import LabCheckFailed

    worker = _worker_with(tmp_path, "import torch\n" + ADD_KERNEL + "\n\ndef add(x, y):\n" + body)

    def check(out, args):
        torch.testing.assert_close(out, args[0] + args[1])

    record_only = dict(check=check, label="add", calls=3, require_kernel=True)
    try:
        spec = tensors([[8, 16], [8, 16]], device="cpu", seed=2)
        if passes:
            perf.timed(worker.module("mod").add, spec, **record_only)
        else:
            with pytest.raises(LabCheckFailed, match="did not pass its inputs"):
                perf.timed(worker.module("mod").add, spec, **record_only)
    finally:
        worker.close()


def test_the_garbage_collector_is_paused_for_the_timed_calls_in_process_and_in_the_worker(tmp_path):
    """A collection inside a clocked batch stalls the host past the device's hold (timeit pauses it too)."""
    import gc

    import torch

    from infracourse import bench
    from infracourse.grading import perf
    from infracourse.grading.inputs import tensors

    seen = []

    def add(x, y):
        seen.append(gc.isenabled())
        return x + y

    bench.measure(add, make_args=lambda: (torch.ones(4), torch.ones(4)), warmup=2, reps=5, device="cpu")
    assert seen[:2] == [True, True] and seen[2:7] == [False] * 5 and gc.isenabled()

    worker = _worker_with(tmp_path, "import gc\nseen = []\n"
                                    "def add(x, y):\n    seen.append(gc.isenabled())\n    return x + y\n"
                                    "def states():\n    return [int(s) for s in seen] + [int(gc.isenabled())]\n")
    judged = []
    request = worker.request

    def judge_side(op, *args, **kwargs):
        if op == "time_run":
            judged.append(gc.isenabled())
        return request(op, *args, **kwargs)

    worker.request = judge_side
    try:
        module = worker.module("mod")
        perf.timed(module.add, tensors([[64], [64]], device="cpu", seed=1), check=lambda out, args: None,
                   label="add", calls=4)
        states = module.states()
    finally:
        worker.close()
    *calls, after = states
    assert calls[-4:] == [0] * 4 and after == 1  # the judge's clocked batch ran with collections paused
    assert judged == [False] and gc.isenabled()  # and so did the judge while its clock ran


def test_a_batch_that_outran_its_hold_is_clocked_once_more_with_a_hold_that_covers_its_launches():
    from infracourse.bench import rehold

    assert rehold(8e-3, 5e-3) is None  # the device was still held when the last call was enqueued
    assert rehold(8e-3, 9.8e-3) == pytest.approx(HOLD_S + 2 * 9.8e-3)  # the host stalled: held twice as long
    assert rehold(80e-3, 120e-3) == MAX_HOLD_S  # never past the longest hold
    assert rehold(MAX_HOLD_S, 0.2) is None  # already the longest: the figure stands as measured
    # the hold asked covered the launches but the device was held for less (the spin ran short): once more
    assert rehold(8e-3, 5e-3, held_s=1e-3) == pytest.approx(2 * 8e-3)  # at least twice the last hold


def test_a_worker_that_keeps_reporting_a_short_hold_gets_a_few_batches_at_most():
    from infracourse.bench import rehold

    hold, batches = HOLD_S, 1
    while (hold := rehold(hold, 1e-3, held_s=0.0)) is not None:
        batches += 1
    assert batches <= 11  # the hold at least doubles each time, from HOLD_S to MAX_HOLD_S


class _FakeDevice:
    """A device clock for the spin kernel: the first launch also loads the kernel (30 ms), and each launch
    reaches the device 8 us after the event before it fired."""
    def __init__(self, cycles_per_s):
        self.now, self.rate, self.loaded = 0.0, cycles_per_s, False

    def sleep(self, cycles):
        self.now += 8e-6 + (0.0 if self.loaded else 30e-3) + cycles / self.rate
        self.loaded = True

    def event(self, enable_timing=True):
        device = self

        class Event:
            def record(self):
                self.at = device.now

            def synchronize(self):
                pass

            def query(self):
                return True

            def elapsed_time(self, other):
                return (other.at - self.at) * 1e3
        return Event()


def test_the_spin_kernels_rate_leaves_out_the_first_launch_and_the_launch_gap(monkeypatch):
    import torch

    from infracourse import bench

    device = _FakeDevice(1.98e9)
    monkeypatch.setattr(torch.cuda, "Event", device.event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", device.sleep, raising=False)
    monkeypatch.setattr(bench, "_cycles_per_s", None)
    monkeypatch.setattr(bench, "_last_hold", None)
    held = bench.hold_device(20e-3)
    assert bench._cycles_per_s == pytest.approx(1.98e9, rel=1e-3)
    assert held.seconds() == pytest.approx(20e-3, rel=1e-2)  # as asked: it was 0.8 ms on the H200 before
    device.rate = 1.5e9  # the clock dropped: the next hold measures the new rate from the last one
    bench.hold_device(20e-3)
    bench.hold_device(20e-3)
    assert bench._cycles_per_s == pytest.approx(1.5e9, rel=1e-2)


def test_the_worker_reports_how_long_the_host_took_to_enqueue_the_clocked_batch(tmp_path):
    from infracourse.grading.inputs import tensors

    worker = _worker_with(tmp_path, "import time\ndef slow(x):\n    time.sleep(0.002)\n    return x * 2\n")
    try:
        fn = worker.module("mod").slow
        worker.request("time_prepare", {"make_args": tensors([[8]], device="cpu", seed=0)}, target=fn._handle.id,
                       calls=3)
        ran = worker.request("time_run", hold_s=0.0, calls=3, salt=2**41).value
    finally:
        worker.close()
    assert ran["calls"] == 3 and 3 * 0.002 <= ran["enqueue_s"] < 1.0


DOUBLE_WITH_A_THREADED_BACKWARD = '''
import threading

import torch
import triton
import triton.language as tl


@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)


def _launch(x):
    y = torch.empty_like(x)
    _double[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _launch(x)

    @staticmethod
    def backward(ctx, dy):  # launched from another thread, as autograd launches a CUDA backward
        out = []
        thread = threading.Thread(target=lambda: out.append(_launch(dy.clone())))  # a copy made off the watched thread
        thread.start()
        thread.join()
        return out[0]


def double(x):
    return Double.apply(x) if USE_KERNEL else x * 2
'''


@pytest.mark.parametrize("use_kernel", [True, False])
def test_a_timed_forward_and_backward_counts_kernels_launched_from_any_thread(tmp_path, use_kernel):
    """Week 10 times a norm's forward + backward (kit.probes.ForwardBackward) with require_kernel: the backward's
    kernels, which autograd launches from its own thread on a GPU, count; torch computing the answer fails."""
    import torch

    from infracourse.grading import perf
    from infracourse.grading.inputs import tensors
    from infracourse.grading.protocol import BuildInWorker
    from infracourse.failures import LabCheckFailed

    worker = _worker_with(tmp_path, f"USE_KERNEL = {use_kernel}\n" + DOUBLE_WITH_A_THREADED_BACKWARD)

    def check(out, args):
        x, dy = args
        torch.testing.assert_close(out[0], 2 * x)
        torch.testing.assert_close(out[1], 2 * dy)

    try:
        both = worker.build(BuildInWorker("infracourse.kit.probes:ForwardBackward", (worker.module("mod").double,)))
        spec = tensors([[1000], [1000]], device="cpu", seed=1)
        if use_kernel:
            perf.timed(both, spec, check=check, label="double", require_kernel=True, calls=4)
        else:
            with pytest.raises(LabCheckFailed, match="launched no Triton kernel"):
                perf.timed(both, spec, check=check, label="double", require_kernel=True, calls=4)
    finally:
        worker.close()


def test_a_batchs_own_costs_are_the_quicker_of_two_empty_batches_and_capped():
    from infracourse import bench

    empty = iter([1.2e-3, 0.9e-3])
    assert bench.batch_overhead(50e-3, lambda hold: next(empty)) == pytest.approx(0.9e-3)
    # an untrusted worker whose empty batches are slow buys no more than the cap off the judge's clock
    assert bench.batch_overhead(50e-3, lambda hold: 0.5) == bench.MAX_OVERHEAD_CREDIT_S


def test_the_judges_clock_of_a_batch_leaves_out_what_an_empty_batch_costs(tmp_path, monkeypatch):
    """A fixed cost of every clocked request (the channel, waking each side: ~1 ms on the H200) would otherwise
    land on the calls: 50 us a call over a batch of 20, more than a small kernel takes. A real worker answers;
    the judge's clock is a fake one that each request moves by a known amount, so a loaded CI machine's
    scheduling noise cannot decide this test."""
    import types

    from infracourse.grading import perf
    from infracourse.grading.inputs import tensors

    fixed_cost, call_cost, draw_cost = 1.5e-3, 3e-3, 0.4e-3
    clock = types.SimpleNamespace(now=100.0)
    monkeypatch.setattr(perf, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(perf, "input_draw_seconds", lambda generate: draw_cost)
    worker = _worker_with(tmp_path, "def double(x):\n    return x * 2\n")
    request = worker.request

    def with_fixed_cost(op, *args, **kwargs):
        reply = request(op, *args, **kwargs)
        if op in ("time_idle", "time_run"):  # the same cost for an empty batch and a full one, besides its calls
            per_call = call_cost + draw_cost  # a full batch also draws its inputs inside the clock
            clock.now += fixed_cost + reply.value["hold_s"] + (per_call * kwargs["calls"] if op == "time_run" else 0)
        return reply

    worker.request = with_fixed_cost
    try:
        timing = perf.timed(worker.module("mod").double, tensors([[8]], device="cpu", seed=0),
                            check=lambda out, args: None, label="double", calls=4)
    finally:
        worker.close()
    # without the credits: 3 ms + 0.4 ms + 1.5 ms / 4 calls = 3.775 ms a call
    assert timing.wall_per_call_s == pytest.approx(call_cost, abs=1e-9)
