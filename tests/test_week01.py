"""Week 1 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import invented, reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week01")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week01", source="starter", stamp=False)
    assert not result.complete
    assert checks["warmup"].status == "failed"
    assert "write the warm-up loop and the timed loop" in checks["warmup"].message
    assert "linear-interpolation percentile" in checks["percentiles"].message
    assert "loop_sum in loop_sum.c returned 0.0" in checks["compiled-loop"].message
    assert checks["report"].status == "failed"
    assert "in your own words" in checks["report"].message


HARNESS, BENCHMARK, C_LOOP = "harness.py", "benchmark.py", "loop_sum.c"
VARIANTS = {
    # the clock is read as soon as fn returns: asynchronous work is not waited for
    "no synchronisation": ("sync-thread", HARNESS, replace_once(
        "        fn(*args)\n        sync()  # an asynchronous call returns before its work is done: wait before "
        "reading the clock\n", "        fn(*args)\n")),
    # the warm-up calls are timed and kept with the others
    "warm-up included": ("warmup", HARNESS, lambda text: replace_once(
        "    for _ in range(warmup):\n        fn(*make_args())\n", "")(text).replace(
        "for _ in range(reps):", "for _ in range(warmup + reps):")),
    # no warm-up at all: the slow first calls land in the samples
    "no warm-up": ("warmup", HARNESS, replace_once(
        "    for _ in range(warmup):\n        fn(*make_args())\n", "")),
    # the smallest sample whose rank covers q: right for large n, wrong between ranks
    "nearest-rank percentile": ("percentiles", HARNESS, replace_once(
        "    below, above = math.floor(rank), math.ceil(rank)\n"
        "    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)",
        "    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]")),
    # population standard deviation instead of the sample one
    "std divides by n": ("percentiles", HARNESS, replace_once("statistics.stdev(samples)", "statistics.pstdev(samples)")),
    # the clock starts before the inputs are prepared
    "inputs prepared inside the timer": ("timing-scope", HARNESS, replace_once(
        "        args = make_args()  # fresh inputs every call, prepared outside the timed region\n"
        "        sync()  # work queued earlier (warm-up, make_args) must not finish inside this sample\n"
        "        start = time.perf_counter()\n",
        "        start = time.perf_counter()\n        args = make_args()\n        sync()\n")),
    # throughput derived from latency, as if calls never overlapped
    "throughput from mean latency": ("concurrency", HARNESS, replace_once(
        '"throughput": calls / wall,', '"throughput": 1 / statistics.fmean(latencies),')),
    # the list-to-tensor conversion timed together with the sum
    "conversion timed with the sum": ("overhead", BENCHMARK, replace_once(
        "time_calls(torch.sum, lambda: (tensor,),", "time_calls(lambda: torch.sum(torch.tensor(values)),")),
    # samples written with 3 significant digits: the summary no longer recomputes from them
    "raw samples rounded": ("raw-data", BENCHMARK, replace_once("repr(s)", 'f"{s:.3g}"')),
    # class 6: waits on two calls of three; the median of the samples is still the job's length
    "sync skipped on every third call": ("sync-thread", HARNESS, replace_once(
        "        fn(*args)\n        sync()  # an asynchronous call returns before its work is done: wait before "
        "reading the clock\n", "        fn(*args)\n        if len(samples) % 3:\n            sync()\n")),
    # class 7: no sync before the clock starts: the first sample also waits for the warm-up calls' queued work
    "no sync before the clock": ("sync-thread", HARNESS, replace_once(
        "        sync()  # work queued earlier (warm-up, make_args) must not finish inside this sample\n", "")),
    # class 1: figures returned without measuring (plausible on this machine, but not measured in the call)
    "hard-coded overhead": ("overhead", BENCHMARK, replace_once(
        '    """Nanoseconds per element of a Python loop and of torch.sum over the same n floats (medians)."""\n',
        '    """Nanoseconds per element of a Python loop and of torch.sum over the same n floats (medians)."""\n'
        '    return {"n": n, "loop_ns_per_element": 20.0, "vectorised_ns_per_element": 0.05}\n')),
    # class 1: a fabricated sweep: the concurrent runs never made, their latencies invented
    "concurrency sweep invented": ("raw-data", BENCHMARK, replace_once(
        "            result = run_concurrent(fn, concurrency=c, calls=calls * c)\n",
        "            result = {'latencies': [0.0062] * (calls * c), 'throughput': c / 0.0062}\n")),
    # correctness of the compiled loop: the last element is never added
    "C loop skips the last element": ("compiled-loop", C_LOOP, replace_once("i < n;", "i < n - 1;")),
    # class 1: the compiled figure written down, not measured
    "compiled figure hard-coded": ("compiled-loop", BENCHMARK, replace_once(
        '    source = Path(__file__).with_name("loop_sum.c")\n',
        '    return {"n": n, "c_ns_per_element": 0.55}\n')),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, file, edit = VARIANTS[name]
    assert_variant_fails(grade_lab, "week01", check_id, {file: edit})


def test_a_harness_that_never_syncs_fails_naming_sync(grade_lab):
    """The commonest first mistake: sync() is never called, so no queued job has finished when the harness
    returns. A failed check that names the fix, not a grader crash (an empty list of job durations)."""
    never = lambda text: replace_once(  # noqa: E731 - both waits removed
        "        sync()  # work queued earlier (warm-up, make_args) must not finish inside this sample\n", "")(
        replace_once("        sync()  # an asynchronous call returns before its work is done: wait before "
                     "reading the clock\n", "")(text))
    check = assert_variant_fails(grade_lab, "week01", "sync-thread", {HARNESS: never})
    assert "Call sync() after fn" in check.message, check.message


def test_a_percentile_that_sorts_the_callers_list_fails(grade_lab):
    """The list is reordered in the worker, where the learner's code runs: a copy sent from the judge would
    never show it."""
    in_place = replace_once("    ordered = sorted(samples)\n", "    samples.sort()\n    ordered = samples\n")
    check = assert_variant_fails(grade_lab, "week01", "percentiles", {HARNESS: in_place})
    assert "reordered the caller's list" in check.message and "sorted(samples)" in check.message, check.message


def test_a_compiled_loop_built_by_the_grader_kit_fails(grade_lab):
    """kit.native is mounted for the grader's own build of loop_sum.c; measure_compiled timing its CompiledLoop
    passed compiled-loop without cc or ctypes of its own."""
    kit_build = replace_once(
        '    source = Path(__file__).with_name("loop_sum.c")\n',
        '    from infracourse.kit.native import CompiledLoop\n'
        '    loop = CompiledLoop(Path(__file__).with_name("loop_sum.c"), n, 0)\n'
        '    samples = time_calls(loop.total, warmup=3, reps=reps, sync=no_sync)\n'
        '    return {"n": n, "c_ns_per_element": statistics.median(samples) / n * 1e9, "total": loop.total(),\n'
        '            "samples": samples}\n'
        '    source = Path(__file__).with_name("loop_sum.c")\n')
    check = assert_variant_fails(grade_lab, "week01", "compiled-loop", {"benchmark.py": kit_build})
    assert "benchmark.py:" in check.message and "reaches infracourse.kit.native" in check.message, check.message


HONEST = Path(__file__).parent / "fixtures" / "honest" / "week01"


@pytest.mark.parametrize("style", ["ns_clock_threads", "numpy_pool"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, style):
    """Written from the handout alone, unlike the reference: a grader that fails one of them is wrong."""
    edits = {path.name: path.read_text() for path in (HONEST / style).iterdir() if path.suffix in (".py", ".c")}
    assert_solution_passes(grade_lab, machine, "week01", edits=edits)


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week01", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    _, checks = grade_lab("week01", edits={"report.md": invented("loop_ns_per_element", 10.0)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "loop_ns_per_element = " in checks["report"].message and "the grader measured" in checks["report"].message


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="a GPU-only mistake: needs a CUDA GPU")
def test_no_device_sync_fails_on_the_gpu(grade_lab):
    """The harness waits for nothing on a GPU: identical to the solution on a CPU, wrong where kernels are
    asynchronous (sync-cuda times a 5 ms device sleep)."""
    edit = replace_once("    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)",
                        "    return lambda: None")
    assert_variant_fails(grade_lab, "week01", "sync-cuda", {HARNESS: edit})


def test_the_handout_states_the_graders_workloads():
    """The handout's table gave a 30 ms slow start and a 10 ms make_args while the grader used 60 ms and 30 ms: the
    numbers a learner reads are the ones the grader's workloads are built with (read from the grader's source)."""
    import ast

    root = Path(__file__).parent.parent
    handout = (root / "labs" / "week01-timing" / "README.md").read_text()
    tree = ast.parse((root / "graders" / "week01" / "test_harness.py").read_text())
    calls = {node.func.id: node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    constants = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                 and isinstance(node.value, ast.Constant)}
    slow = {k.arg: ast.literal_eval(k.value) for k in calls["SlowStart"].keywords}
    fast = ast.literal_eval(calls["SlowStart"].args[0])
    assert (f"first {slow['slow_calls']} calls take {slow['slow_s'] * 1e3:.0f} ms and later ones "
            f"{fast * 1e3:.0f} ms") in handout
    assert f"no sample above {slow['slow_s'] * 1e3 / 2:.0f} ms" in handout
    assert f"`make_args` takes {constants['PREPARE_S'] * 1e3:.0f} ms" in handout
    assert f"hands a {ast.literal_eval(calls['ThreadQueue'].args[0]) * 1e3:.0f} ms job" in handout
