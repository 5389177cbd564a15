"""Grader integrity: every known way of fooling a kernel benchmark fails against the shared harness
(observe, verdicts, bench, compare, grading.perf). CPU-only: Triton kernels run in the interpreter and
bench.measure times on the host; the GPU-only paths (side streams, the caching allocator) are in
test_integrity_gpu.py. Learner functions are called in a grading worker, as graders call them. Each cheat is a
small working function, so each test shows the defence, not a stub."""
from __future__ import annotations

import os
import statistics
import time

import pytest
import torch

from infracourse import bench
from infracourse.compare import assert_close
from infracourse.failures import LabCheckFailed
from infracourse.grading import perf
from infracourse.grading.inputs import tensors
from infracourse.grading.verdicts import fenced, require_plain_tensor, require_possible, run_watched
from infracourse.hardware import Ceilings

ROWS, COLS = 6, 1000


# ----------------------------------------------------------------- small Triton softmaxes, right and wrong
KERNELS = """
import threading

import torch
import triton
import triton.language as tl


@triton.jit
def row_softmax(x_ptr, y_ptr, n, BLOCK: tl.constexpr, SUBTRACT_MAX: tl.constexpr, MASK_LOAD: tl.constexpr,
                MASK_STORE: tl.constexpr, FP16: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    offsets = tl.program_id(0) * n + cols
    if MASK_LOAD:
        x = tl.load(x_ptr + offsets, mask=cols < n, other=-float("inf"))
    else:
        x = tl.load(x_ptr + offsets)
    x = x.to(tl.float16) if FP16 else x.to(tl.float32)
    if SUBTRACT_MAX:
        x = x - tl.max(x, axis=0)
    numerator = tl.exp(x)
    y = numerator / tl.sum(numerator, axis=0)
    if MASK_STORE:
        tl.store(y_ptr + offsets, y.to(tl.float32), mask=cols < n)
    else:
        tl.store(y_ptr + offsets, y.to(tl.float32))


def _launch(x, subtract_max=True, mask_load=True, mask_store=True, fp16=False):
    y = torch.empty_like(x)
    n = x.shape[-1]
    row_softmax[(x.shape[0],)](x, y, n, BLOCK=triton.next_power_of_2(n), SUBTRACT_MAX=subtract_max,
                               MASK_LOAD=mask_load, MASK_STORE=mask_store, FP16=fp16)
    return y


def softmax(x):
    return _launch(x)


def no_max_subtraction(x):
    return _launch(x, subtract_max=False)


def no_load_mask(x):
    return _launch(x, mask_load=False)


def no_store_mask(x):
    return _launch(x, mask_store=False)


def in_fp16(x):
    return _launch(x, fp16=True)
"""

# Cheats: launch the right kernel for show, return what torch computed (`{compute}` is the expression).
CHEAT = """

def cheat_{name}(x):
    _launch(x)
    return {compute}
"""

LIBRARY_CHEATS = {
    "torch.softmax": "torch.softmax(x, dim=-1)",
    "F.softmax": "torch.nn.functional.softmax(x, dim=-1)",
    "Tensor.softmax": "x.softmax(-1)",
    "exp / sum by hand": "(x - x.amax(-1, keepdim=True)).exp() / (x - x.amax(-1, keepdim=True)).exp().sum(-1, "
                         "keepdim=True)",
    "on another thread": "_in_a_thread(x)",
}

OTHER_CHEATS = """

def _in_a_thread(x):
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("y", torch.softmax(x, dim=-1)))
    worker.start()
    worker.join()
    return result["y"]


SMUGGLED = {}  # the interpreter runs a kernel body with its module's globals


@triton.jit
def smuggler(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    SMUGGLED["y"] = torch.softmax(SMUGGLED["x"], dim=-1)
    cols = tl.arange(0, BLOCK)
    tl.store(y_ptr + cols, tl.load(x_ptr + cols, mask=cols < n), mask=cols < n)


def smuggled(x):
    SMUGGLED["x"] = x
    smuggler[(1,)](x, torch.empty_like(x), x.numel(), BLOCK=1024)
    return SMUGGLED["y"]


def no_kernel(x):
    return torch.empty_like(x)


def overwrite_then_answer(x):
    x.zero_()  # softmax of zeros is uniform: a reference computed from x afterwards would agree
    return torch.full_like(x, 1 / x.shape[-1])


def skips_last(x):  # the last element never written (poisoned outputs start as NaN)
    out = torch.empty_like(x)
    out[:-1] = x[:-1] * 2
    return out


def reads_past(x):  # shifted by one, the element past the end read where the storage has one
    room = x.untyped_storage().nbytes() // x.element_size() - x.storage_offset()
    beyond = x.as_strided((1,), (1,), x.storage_offset() + x.numel()) if room > x.numel() else x.new_zeros(1)
    return torch.cat([x[1:], beyond]) * 2


def skipped(x, y):  # claims to move a GB, returns at once (a cached or skipped computation)
    return x


def add(x, y):
    return x + y


def _do_bench(kernel_call, quantiles=None):  # launches each configuration a few times, under the interpreter
    for _ in range(3):
        kernel_call()
    return [1.0, 1.0, 1.0]


def _pre_hook(nargs):
    SMUGGLED["sum"] = torch.add(nargs["x_ptr"], nargs["y_ptr"])


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, pre_hook=_pre_hook),
                          triton.Config({"BLOCK": 32}, pre_hook=_pre_hook)], key=["n"], do_bench=_do_bench)
@triton.jit
def hooked_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def hooked_add(x, y):
    out = torch.empty_like(x)
    hooked_add_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, out, x.numel())
    return out
"""


def _cheat_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower())


def _start_worker(folder, source: str):
    from infracourse.grading.remote import WorkerClient

    folder.mkdir()
    (folder / "softmaxes.py").write_text(source)
    return WorkerClient(folder, gpu=False)


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """Two learners' modules in grading workers under the Triton interpreter, as a CPU grade runs them: the
    right kernel and its wrong variants, and the same with the cheats beside them."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    root = tmp_path_factory.mktemp("integrity")
    cheats = KERNELS + OTHER_CHEATS + "".join(CHEAT.format(name=_cheat_name(n), compute=c)
                                              for n, c in LIBRARY_CHEATS.items())
    workers = {"honest": _start_worker(root / "honest", KERNELS), "cheats": _start_worker(root / "cheats", cheats)}
    try:
        yield {name: worker.module("softmaxes") for name, worker in workers.items()}
    finally:
        for worker in workers.values():
            worker.close()
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _rows(scale=1.0, offset=0.0):
    return torch.randn(ROWS, COLS) * scale + offset


def _expected(x):
    return torch.softmax(x.double(), dim=-1)


def test_the_right_kernel_passes_every_defence(learner):
    for x in (_rows(), _rows(offset=1e4), fenced(_rows(scale=1e3))):
        out = run_watched(learner["honest"].softmax, x, name="softmax", replaces="torch.softmax")
        require_plain_tensor(out, like=x)
        assert_close(out, _expected(x))


# ----------------------------------------------------------------- calling the library op
@pytest.mark.parametrize("name", list(LIBRARY_CHEATS))
def test_calling_the_library_op_fails_kernel_did_work(learner, name):
    cheat = getattr(learner["cheats"], f"cheat_{_cheat_name(name)}")
    with pytest.raises(LabCheckFailed, match=r"called torch compute ops \[.*(softmax|exp|amax|sum)"):
        run_watched(cheat, _rows(), name="softmax", replaces="torch.softmax")


def _dispatch_mode_switched_off(x):
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return torch.softmax(x, dim=-1)


def _python_dispatch_excluded(x):
    with torch._C._DisableTorchDispatch():
        return torch.softmax(x, dim=-1)


@pytest.mark.parametrize("dodge", [_dispatch_mode_switched_off, _python_dispatch_excluded,
                                   lambda x: torch.ops.aten._softmax.default(x, -1, False)])
def test_ops_reached_past_the_dispatch_mode_are_still_seen(dodge):
    """The dispatch mode switched off, Python dispatch excluded, the aten op called directly: in a grade the
    judge's reading of the sources refuses these private APIs before any call (test_provenance); the profiler
    beside the dispatch mode sees the op all the same."""
    from infracourse.observe import watch_call

    with watch_call() as record:
        dodge(_rows())
    assert "_softmax" in record.compute_ops()


def test_torch_called_inside_an_interpreted_kernel_body_is_seen(learner):
    # Under the interpreter a kernel body is plain Python: a torch call there is the learner's, not Triton's.
    with pytest.raises(LabCheckFailed, match="_softmax"):
        run_watched(learner["cheats"].smuggled, _rows(), name="softmax", replaces="torch.softmax")


def test_no_kernel_at_all_fails(learner):
    with pytest.raises(LabCheckFailed, match="launched no Triton kernel"):
        run_watched(learner["cheats"].no_kernel, _rows(), name="softmax")


def test_a_local_function_is_not_judged_as_a_learners():
    with pytest.raises(TypeError, match="grading worker"):
        run_watched(lambda x: x, _rows(), name="softmax")


# ----------------------------------------------------------------- numerics: overflow, masks, precision
def test_no_max_subtraction_fails_the_overflow_check(learner):
    naive = learner["honest"].no_max_subtraction
    x = _rows()
    assert_close(naive(x), _expected(x))  # ordinary values: the naive kernel is right...
    for big in (_rows(offset=1e4), _rows(offset=-1e4), _rows(scale=1e3)):
        with pytest.raises(LabCheckFailed, match="NaN|infinities|out of tolerance"):
            assert_close(naive(big), _expected(big))  # ...until exp overflows (inf/inf) or underflows (0/0)


def test_missing_tail_mask_on_load_reads_the_fence(learner):
    x = fenced(_rows()[:1])  # one row of 1000: a block of 1024 runs 24 elements past the end
    out = run_watched(learner["honest"].no_load_mask, x, name="softmax")
    with pytest.raises(LabCheckFailed, match="NaN"):
        assert_close(out, _expected(x))


def test_missing_tail_mask_on_store_hits_a_canary(learner):
    with pytest.raises(LabCheckFailed, match=r"wrote \d+ element\(s\) outside"):
        run_watched(learner["honest"].no_store_mask, _rows(), name="softmax")


def test_fp32_computed_in_fp16_fails_the_fp32_tolerance(learner):
    x = _rows()
    assert_close(learner["honest"].softmax(x), _expected(x))
    with pytest.raises(LabCheckFailed, match="out of tolerance"):
        assert_close(learner["honest"].in_fp16(x), _expected(x))


def test_a_failure_says_whether_whole_blocks_are_wrong_or_precision_is_lost():
    from infracourse.compare import assert_grad_close

    expected = torch.randn(8, 64, dtype=torch.float64)
    expected += 0.5 * expected.sign()  # no element near zero, where a flipped sign would be a small error
    skipped = expected.float().clone()
    skipped[5:7] = 0.0  # two rows a program never computed
    with pytest.raises(LabCheckFailed, match=r"large errors lie in rows 5-6, columns 0-63 while the rest of the output "
                                             "is right: a block or row was skipped"):
        assert_close(skipped, expected)
    tail = expected[0].float().clone()
    tail[40:] *= -1  # a 1-D output wrong from element 40 on
    with pytest.raises(LabCheckFailed, match="lie in elements 40-63 while the rest of the output is right"):
        assert_grad_close(tail, expected[0], what="dw")
    imprecise = (expected * (1 + 1e-3)).float()  # small errors everywhere: precision, no block named
    with pytest.raises(LabCheckFailed, match="out of tolerance") as failure:
        assert_close(imprecise, expected)
    assert "rest of the output is right" not in str(failure.value)


def test_nan_between_fences_is_told_apart_never_written_from_read_past_the_end(learner):
    from infracourse.grading.verdicts import explain_nan

    skips_last, reads_past = learner["cheats"].skips_last, learner["cheats"].reads_past
    x = fenced(torch.randn(10))
    with pytest.raises(LabCheckFailed, match=r"1 output element\(s\) never written \(first at \[9\]"):
        explain_nan(skips_last, (x,), name="f", what="f", never_written="", past_end="")
    assert torch.isnan(run_watched(reads_past, x, name="f", require_kernel=False)).any()
    with pytest.raises(LabCheckFailed, match="read from past the end of an input"):
        explain_nan(reads_past, (x,), name="f", what="f", never_written="", past_end="")


# ----------------------------------------------------------------- lazy, subclassed, misplaced outputs
class Subclassed(torch.Tensor):
    pass


class LazyWrapper:
    """Looks like a tensor to torch functions, computes only when asked."""

    def __init__(self, compute):
        self.compute = compute

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = [a.compute() if isinstance(a, LazyWrapper) else a for a in args]
        return func(*args, **(kwargs or {}))


BAD_OUTPUTS = {
    "a torch.Tensor subclass": lambda x: torch.softmax(x, -1).as_subclass(Subclassed),
    "an nn.Parameter": lambda x: torch.nn.Parameter(torch.softmax(x, -1), requires_grad=False),
    "a lazy wrapper": lambda x: LazyWrapper(lambda: torch.softmax(x, -1)),
    "a NumPy array": lambda x: torch.softmax(x, -1).numpy(),
    "a meta tensor": lambda x: torch.empty_like(x, device="meta"),
    "a sparse tensor": lambda x: torch.softmax(x, -1).to_sparse(),
    "a nested tensor": lambda x: torch.nested.nested_tensor(list(torch.softmax(x, -1))),
    "the wrong dtype": lambda x: torch.softmax(x, -1).double(),
    "the wrong shape": lambda x: torch.softmax(x, -1)[:, :-1],
}


@pytest.mark.parametrize("name", list(BAD_OUTPUTS))
def test_lazy_subclassed_or_misplaced_outputs_are_rejected(name):
    x = _rows()
    with pytest.raises(LabCheckFailed):
        require_plain_tensor(BAD_OUTPUTS[name](x), like=x, what="softmax output")


def test_a_plain_output_is_accepted():
    x = _rows()
    assert require_plain_tensor(torch.softmax(x, -1), like=x) is not None


# ----------------------------------------------------------------- caches and skipped work under bench.measure
def _check_softmax(out, args):
    assert_close(out, _expected(args[0]), what="a timed softmax")


def _fresh():
    return (_rows(),)


def test_an_output_cache_keyed_by_data_ptr_is_caught():
    cache, hits = {}, []

    def cached_softmax(x):
        key = (x.data_ptr(), tuple(x.shape))
        if key in cache:
            hits.append(key)
            return cache[key]
        return cache.setdefault(key, torch.softmax(x, -1))

    with pytest.raises(LabCheckFailed, match="out of tolerance"):
        bench.measure(cached_softmax, make_args=_fresh, check=_check_softmax, reps=200, device="cpu")
    assert hits, "the allocator never reused an address: this test proved nothing"


def test_an_output_cache_keyed_by_content_never_hits():
    seen, hits = set(), []

    def cached_softmax(x):
        key = hash(x.numpy().tobytes())
        if key in seen:
            hits.append(key)
        seen.add(key)
        return torch.softmax(x, -1)

    bench.measure(cached_softmax, make_args=_fresh, check=_check_softmax, reps=200, device="cpu")
    assert not hits and len(seen) > 200  # fresh values every call (warm-up and checks included): nothing to reuse


def test_skipping_the_work_on_calls_a_fixed_schedule_would_not_check_is_caught():
    calls = []

    def lazy_softmax(x):
        calls.append(1)
        n = len(calls) - 3  # the timed call number, after 3 warm-up calls
        if n == 1 or n % 10 == 0 or n > 200:  # the calls a fixed schedule (first, every tenth, the extra) checks
            return torch.softmax(x, -1)
        return torch.empty_like(x)

    with pytest.raises(LabCheckFailed, match="out of tolerance|NaN"):
        bench.measure(lazy_softmax, make_args=_fresh, check=_check_softmax, reps=200, device="cpu")


def test_a_function_that_changes_its_input_is_caught(learner):
    def overwrite_then_answer(x):
        x.zero_()  # softmax of zeros is uniform: a reference computed from x afterwards would agree
        return torch.full_like(x, 1 / x.shape[-1])

    with pytest.raises(LabCheckFailed, match="modified its input"):
        bench.measure(overwrite_then_answer, make_args=_fresh, check=_check_softmax, reps=20, device="cpu")
    with pytest.raises(LabCheckFailed, match="modified its input"):
        run_watched(learner["cheats"].overwrite_then_answer, _rows(), name="softmax", require_kernel=False)


def test_checks_see_a_private_copy_of_the_inputs():
    seen = []
    bench.measure(lambda x: torch.softmax(x, -1), make_args=_fresh, reps=20, device="cpu",
                  check=lambda out, args: seen.append(args[0]))
    assert seen and all(isinstance(a, torch.Tensor) for a in seen)


# ----------------------------------------------------------------- side streams: the escaped logic
def _timing(median_s, wall_s, device="cuda"):
    return bench.Timing(median_s=median_s, p10_s=median_s, p90_s=median_s, samples_s=[median_s],
                        wall_per_call_s=wall_s, device=device)


@pytest.mark.parametrize("median_us, wall_us, escaped", [
    (2.0, 400.0, True),     # events saw the launch only; the device-wide clock saw the work
    (100.0, 190.0, False),  # under twice: launch overhead and jitter, not hidden work
    (1.0, 15.0, False),     # more than twice but a few microseconds: a tiny kernel's Python overhead
    (300.0, 310.0, False),  # honest
])
def test_escaped_flags_work_outside_the_timed_stream(median_us, wall_us, escaped):
    timing = _timing(median_us * 1e-6, wall_us * 1e-6)
    assert timing.escaped is escaped
    assert timing.seconds == pytest.approx(max(median_us, wall_us) * 1e-6)  # never less than the wall clock saw


@pytest.mark.parametrize("median_us, wall_us, calls, escaped", [
    (50.0, 108.0, 16, False),  # a norm's forward + backward on the H200: 0.9 ms of the batch's own costs over 16 calls
    (7.9, 37.2, 48, False),    # a 512^3 matmul: 1.4 ms over 48 calls
    (2.0, 400.0, 48, True),    # a side stream: far more than any batch's fixed costs
    (5.0, 60.0, 48, True),     # 2.6 ms over the batch: more than its costs explain
])
def test_a_batchs_fixed_costs_are_not_read_as_escaped_work(median_us, wall_us, calls, escaped):
    timing = bench.Timing(median_s=median_us * 1e-6, p10_s=0, p90_s=0, samples_s=[], wall_per_call_s=wall_us * 1e-6,
                          device="cuda", wall_calls=calls)
    assert timing.escaped is escaped
    assert timing.seconds == pytest.approx(wall_us * 1e-6)  # the figure still takes what the device-wide clock saw


def test_cpu_timings_have_no_wall_cross_check():
    timing = _timing(1e-3, None, device="cpu")
    assert not timing.escaped and timing.seconds == 1e-3


def test_timed_rejects_an_escaped_timing(learner, monkeypatch):
    """The worker's events saw far less than the judge's device-wide clock (what a side stream gives on a GPU,
    where test_integrity_gpu runs the real thing): timed refuses the figure."""
    monkeypatch.setattr(perf, "_timed_in_worker", lambda *args: _timing(2e-6, 400e-6))
    with pytest.raises(LabCheckFailed, match="ran outside the timed stream"):
        perf.timed(learner["cheats"].add, tensors([[8], [8]], device="cpu"), check=lambda out, args: None)


def test_timed_refuses_a_local_function():
    with pytest.raises(TypeError, match="grading worker"):
        perf.timed(lambda: None, lambda: (), check=lambda out, args: None)


# ----------------------------------------------------------------- faster than physics, replaced clocks
CEILINGS = Ceilings(device="test", copy_gbps=1000.0, matmul_tflops={"bfloat16": 100.0})


def test_require_possible_floors():
    require_possible(1e-3, bytes_moved=1e9, copy_gbps=1000)  # 1 GB at 1 TB/s takes 1 ms: possible
    with pytest.raises(LabCheckFailed, match="did not do the work"):
        require_possible(0.5e-3, bytes_moved=1e9, copy_gbps=1000)  # twice the bandwidth: beyond the 1.5x slack
    with pytest.raises(LabCheckFailed, match="did not do the work"):
        require_possible(1e-6, flops=1e12, peak_tflops=100)


def test_timed_rejects_a_time_faster_than_the_device_allows(learner):
    skipped, inputs = learner["cheats"].skipped, tensors([[ROWS, COLS], [1]], device="cpu", seed=4)
    # 1 TB at the test's 1 TB/s: a call that skips the work takes far under the 0.67 s floor on any loaded
    # machine (with 1 GB, a 0.67 ms floor, a busy CI machine once timed the no-op above it)
    with pytest.raises(LabCheckFailed, match="did not do the work"):
        perf.timed(skipped, inputs, check=lambda out, args: None, bytes_moved=1e12, ceilings=CEILINGS, calls=4)
    perf.timed(skipped, inputs, check=lambda out, args: None, bytes_moved=8, ceilings=CEILINGS, calls=4)


@pytest.mark.parametrize("target, name", [(time, "perf_counter"), (statistics, "median"),
                                          (torch.cuda, "synchronize"), (torch.cuda.Event, "elapsed_time"),
                                          (bench.Timing, "seconds")])
def test_the_judges_timing_refuses_a_replaced_clock(monkeypatch, target, name):
    # what code loaded into the judge's process after the grader could do: the library op it times is refused
    monkeypatch.setattr(target, name, property(lambda self: 0.0) if target is bench.Timing else lambda *a, **k: 0.0)
    with pytest.raises(LabCheckFailed, match="replaced the clock"):
        perf.reference_time(torch.neg, lambda: (_rows(),))


@pytest.mark.slow
def test_a_cpp_extension_calling_at_softmax_is_seen(tmp_path):
    """The CUDA C++ route's cheat: the library op called from C++. It still goes through the dispatcher,
    where both observers see it (kernel-did-work checks the CUDA route this way on a GPU)."""
    from torch.utils.cpp_extension import load_inline

    from infracourse.observe import watch_call

    extension = load_inline(name="infracourse_integrity_cheat", build_directory=str(tmp_path),
                            cpp_sources="torch::Tensor softmax(torch::Tensor x) { return torch::softmax(x, -1); }",
                            functions=["softmax"])
    with watch_call() as record:
        extension.softmax(_rows())
    assert "_softmax" in record.compute_ops()


# ----------------------------------------------------------------- ops classified by what they do
@pytest.mark.parametrize("name, effect", [
    ("new_zeros", "factory"), ("ones_like", "factory"), ("empty", "factory"), ("zeros", "factory"),
    ("transpose", "view"), ("permute", "view"), ("slice", "view"), ("as_strided", "view"), ("detach_", "view"),
    ("copy_", "copy"), ("lift_fresh", "copy"), ("clone", "copy"),
    ("add", "compute"), ("add_", "compute"), ("_softmax", "compute"), ("mm", "compute"), ("sum", "compute"),
    ("not_an_aten_op", "compute"),
])
def test_ops_are_classified_by_their_schema(name, effect):
    from infracourse.observe import op_effect

    assert op_effect(name) == effect


def test_allocations_and_views_in_an_honest_kernel_are_not_compute():
    """The ops an honest kernel wrapper uses to allocate and shape its output (issue 9: they used to fail)."""
    from infracourse.observe import watch_call

    x = torch.randn(4, 6)
    with watch_call() as record:
        x.new_zeros(3), torch.ones_like(x), torch.tensor([1.0, 2.0]), x.mT, x.T, torch.empty(5), x[1:].view(-1)
    assert record.ops and record.compute_ops() == []
    with watch_call() as record:
        x + x, torch.softmax(x, -1), x @ x.mT
    assert {"add", "_softmax", "mm"} <= set(record.compute_ops())


def _autotuned_add(reps=200):
    """An add autotuned over two tile sizes, with a do_bench that launches each configuration `reps` times after
    an L2-flush-like zero_ (as Triton's does), so it runs under the interpreter."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
        import triton.language as tl

        flush = torch.empty(64)

        def do_bench(kernel_call, quantiles=None):
            for _ in range(reps):
                flush.zero_()
                kernel_call()
            return [1.0, 1.0, 1.0]

        configs = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})]

        @triton.autotune(configs=configs, key=["n"], do_bench=do_bench)
        @triton.jit
        def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved

    def add(x, y):
        out = torch.empty_like(x)
        add_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, out, x.numel())
        return out
    return add


def test_the_autotuners_benchmarking_is_not_the_learners_call_but_the_chosen_launch_is():
    """Triton benchmarks each configuration thousands of times inside a watched call (week 9's first call of a
    shape): those launches and their L2 flushes are Triton's, and recording them cost ~1.3 s a configuration
    on the H200. The launch of the chosen configuration is the learner's."""
    from infracourse.observe import watch_call

    add = _autotuned_add(reps=200)
    x, y = torch.randn(100), torch.randn(100)
    with watch_call(poison=False, inputs=(x, y)) as record:
        out = add(x, y)
    record.trace_data_flow([x, y], out)
    torch.testing.assert_close(out, x + y)
    assert record.kernels == ["add_kernel"]  # one launch recorded, not 2 x 200 benchmark launches
    assert "zero_" not in record.ops and "zero_" not in record.profiled  # the flushes are not the learner's
    assert record.inputs_read == [0, 1] and record.output_written


def test_torch_compute_in_an_autotune_pre_hook_is_seen(learner):
    """A configuration's pre-hook runs before every launch of the chosen configuration, in the learner's call:
    computing the answer there with torch is recorded like anywhere else."""
    with pytest.raises(LabCheckFailed, match="add"):
        run_watched(learner["cheats"].hooked_add, torch.randn(100), torch.randn(100), name="add",
                    replaces="torch.add")
