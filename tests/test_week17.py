"""Week 17 proves its grader: the solution passes, the starter fails every check saying what to write, each
wrong variant the issue names fails its own check, and honest solutions in two other styles pass:
tests/fixtures/week17-honest (chunked prefill, an asyncio loop running each step in a worker thread,
disconnects and deadlines polled between tokens, 503 refusals; a bench.py that runs the load matrix cell by
cell, with its own seeds, and the matrix it wrote against that server) and tests/fixtures/week17-b-honest (a
thread-safe engine locked only around planning and commit, waiting and running queues as OrderedDicts, a min-heap
of free blocks, growth planned for the whole batch, a free-block watermark at admission, no chunked prefill;
handlers calling the engine directly, one call_soon_threadsafe per step, deadlines as loop timers; a bench.py
with name-derived seeds that checks its own matrix, with the records, matrix and report of its run). Each grade
starts two servers (the learner's and the course's static baseline)."""
import json
import statistics
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import (assert_solution_passes, assert_variant_fails, handout_solution, not_passed,
                      with_stamped_environment)
from reportproof import invented, reworded

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"
SOLUTION = Path(__file__).parent.parent / "labs" / "week17-continuous-batching" / "solution"


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week17")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week17", source="starter", stamp=False)
    assert not result.complete
    # gpu-continuous-batching is blocked on a machine without CUDA; every other check fails
    assert all(c.status == "failed" or (c.status == "blocked" and c.id == "gpu-continuous-batching")
               for c in checks.values()), {c.id: (c.status, c.message) for c in checks.values()}
    for check in ("greedy-outputs", "blocks-freed", "disconnect-frees", "backpressure", "request-timeout",
                  "no-starvation"):
        assert "not written yet" in checks[check].message, (check, checks[check].message)
    assert "python bench.py" in checks["raw-records"].message
    assert "python bench.py" in checks["load-matrix"].message and "missing" in checks["load-matrix"].message


def tpot_over_all_tokens(report: str) -> str:
    """The report with tpot_p50_ms computed the wrong way from the solution's own records: E2EL / n, the first
    token (prefill and queueing) counted as a decode step."""
    records = json.loads((SOLUTION / "records.json").read_text())["records"]
    wrong = statistics.median((r["chunk_times"][-1] - r["send_time"]) / r["output_tokens"] * 1000
                              for r in records if r["success"] and r["output_tokens"] > 1)
    lines = [f"tpot_p50_ms: {wrong:.6g}" if line.startswith("tpot_p50_ms:") else line for line in report.splitlines()]
    return "\n".join(lines) + "\n"


STARVE = replace_once(
    """        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if len(seq.tokens) > budget or not self.blocks.grow(seq, len(seq.tokens)):
                break
            budget -= len(seq.tokens)
            self.running.append(self.waiting.popleft())
            scheduled.append(seq)""",
    """        for seq in sorted(self.waiting, key=lambda s: len(s.tokens)):  # shortest first: packs the batch
            if len(self.running) >= self.cfg.max_num_seqs:
                break
            if len(seq.tokens) > budget or not self.blocks.grow(seq, len(seq.tokens)):
                continue
            budget -= len(seq.tokens)
            self.waiting.remove(seq)
            self.running.append(seq)
            scheduled.append(seq)""")


def deadline_from_first_token(server: str) -> str:
    """The deadline's clock started at the first token (admission) instead of the request's arrival."""
    server = replace_once("            finished, n = False, 0", "            finished, n, first = False, 0, []")(server)
    return replace_once(
        "                token, finished = await asyncio.wait_for(tokens.get(), expires_at - time.monotonic())",
        "                token, finished = await (asyncio.wait_for(tokens.get(), first[0] + timeout - time.monotonic())\n"
        "                                         if first else tokens.get())\n"
        "                first = first or [time.monotonic()]")(server)


MATRIX = SOLUTION / "matrix"


def matrix_edits(change) -> dict:
    """Edits of the solution's matrix/: `change(cells, summary)` rewrites the cells' files ({name: the file's
    JSON}) and matrix.json in place; every cell it touched gets metrics recomputed from its records, as a learner
    who edits records and reruns compute_metrics would have them."""
    from infracourse.kit.loadgen import RequestRecord, compute_metrics
    summary = json.loads((MATRIX / "matrix.json").read_text())
    cells = {row["file"]: json.loads((MATRIX / row["file"]).read_text()) for row in summary["cells"]}
    before = json.dumps(cells)
    touched = change(cells, summary) or []
    for row in summary["cells"]:
        if row["file"] in touched:
            data = cells[row["file"]]
            row["metrics"] = compute_metrics([RequestRecord(**r) for r in data["records"]], data["duration_s"],
                                             percentiles=summary["percentiles"],
                                             goodput_slo_ms=summary["goodput_slo_ms"])
    assert touched or json.dumps(cells) == before
    return {f"matrix/{name}": json.dumps(data) for name, data in cells.items() if name in touched} | {
        "matrix/matrix.json": json.dumps(summary)}


def skip_cell(cells, summary):
    """The open-loop Poisson cell of the shortest lengths never run: gone from matrix.json (the judge does not
    re-run it: only the completeness check can see it)."""
    summary["cells"] = [row for row in summary["cells"] if row["file"] != "in16-out4-r32-b1.json"]


def halve_ttft(cells, summary):
    """matrix.json's TTFT figures of a cell the judge does not re-run, halved: not what its records give."""
    row = next(row for row in summary["cells"] if row["file"] == "in16-out16-c4.json")
    row["metrics"]["ttft_ms"] = {k: v / 2 for k, v in row["metrics"]["ttft_ms"].items()}


def one_user_as_four(cells, summary):
    """The heaviest closed-loop cell's records copied from the one-user cell of the same lengths, the conditions
    and the seed made the four-user cell's so that its prompts, its greedy outputs and its recomputed figures all
    agree: only the load it was run under is wrong."""
    four, one = "in64-out16-c4.json", "in64-out16-c1.json"
    cells[four]["records"] = cells[one]["records"]
    cells[four]["duration_s"] = cells[one]["duration_s"]
    rows = {row["file"]: row for row in summary["cells"]}
    rows[four]["seed"] = rows[one]["seed"]
    return [four]


def faster_server(cells, summary, speedup=2.5):
    """Every cell as a server 2.5x faster than the course's ModelRunner allows would give it (one without the
    step floor, say): a closed loop's whole run compressed, an open loop's latencies compressed on the same
    arrival clock. Records, conditions and figures all agree with each other."""
    for data in cells.values():
        records = data["records"]
        t0 = min(r["send_time"] for r in records)
        closed = data["conditions"]["loop"] == "closed"
        for r in records:
            send = r["send_time"]
            new_send = t0 + (send - t0) / speedup if closed else send
            r["chunk_times"] = [new_send + (t - send) / speedup for t in r["chunk_times"]]
            r["send_time"] = new_send
        data["duration_s"] = max(t for r in records for t in r["chunk_times"]) - t0
    return list(cells)


VARIANTS = {
    # shortest prompt first, skipping what does not fit: long prompts wait while short ones keep coming
    # (the pressure phase sees it too: its later, shorter requests, the one with a deadline among them, pass the
    # waiting ones)
    "scheduler that starves long prompts": ("no-starvation", {"engine.py": STARVE}, ("preemption", "request-timeout")),
    # the report's TPOT divides E2EL by every token, the first (prefill, queueing) included
    "TPOT computed over all tokens": ("raw-records", {"report.md": tpot_over_all_tokens}),
    # a closed stream is only forgotten by the server: the engine generates on into blocks nobody reads
    "blocks not freed on disconnect": ("disconnect-frees", {"server.py": replace_once(
        """        except asyncio.TimeoutError:
            yield sse({"error": {"message": f"timed out after {timeout} s", "code": 504}})
        finally:  # finished, timed out, or the client went away (the stream is cancelled): free its blocks
            engine.streams.pop(seq.id, None)
            engine.aborts.put(seq)""",
        """        except asyncio.TimeoutError:
            yield sse({"error": {"message": f"timed out after {timeout} s", "code": 504}})
            engine.aborts.put(seq)
        finally:
            engine.streams.pop(seq.id, None)""")}),
    # every request is queued, however long the queue
    "unbounded queue (no 429)": ("backpressure", {"server.py": replace_once(
        "    if engine.queued() >= cfg.max_waiting:", "    if False:")}),
    # static batching in disguise: new sequences join only when the batch has emptied
    "admission only into an empty batch": ("throughput-vs-static", {"engine.py": replace_once(
        "        budget = self.cfg.max_num_batched_tokens - len(scheduled)",
        "        budget = 0 if scheduled else self.cfg.max_num_batched_tokens")},
        # it never fills the pool, so it never preempts, and never has every slot taken for the starvation probe
        ("preemption", "no-starvation")),
    # /debug/state built from the configuration: it always says every block is free, under load too (the
    # disconnect probe, which reads the state while a stream is live, sees it as well)
    "state that reports the configuration, not the engine": ("blocks-freed", {"engine.py": replace_once(
        '"free_blocks": len(self.blocks.free),', '"free_blocks": self.cfg.num_blocks,')}, ("disconnect-frees",)),
    # the deadline is computed but never enforced: the request runs to its last token
    "deadline not enforced": ("request-timeout", {"server.py": replace_once(
        "await asyncio.wait_for(tokens.get(), expires_at - time.monotonic())", "await tokens.get()")}),
    # admission looks at the blocks only: a step prefills every prompt that fits the pool, however many tokens
    "scheduler that ignores the token budget": ("token-budget", {"engine.py": replace_once(
        "if len(seq.tokens) > budget or not self.blocks.grow(seq, len(seq.tokens)):",
        "if not self.blocks.grow(seq, len(seq.tokens)):")}),
    # blocks for prompt + max_tokens reserved at admission: no sequence ever needs a block it cannot get, so none
    # is preempted, and fewer run than the pool allows
    "scheduler that never preempts (reserves max_tokens)": ("preemption", {"engine.py": replace_once(
        "if len(seq.tokens) > budget or not self.blocks.grow(seq, len(seq.tokens)):",
        "if len(seq.tokens) > budget or not self.blocks.grow(seq, len(seq.prompt) + seq.max_tokens):")}),
    # a preempted sequence queued behind everything that arrived after it
    "preempted request re-queued at the back": ("preemption", {"engine.py": replace_once(
        "self.waiting.appendleft(victim)", "self.waiting.append(victim)")}),
    # the deadline counted from the first token: a request that waits in the queue is never timed out there
    "deadline counted from admission": ("request-timeout", {"server.py": deadline_from_first_token}),
    "invented server memory in the report": ("report", {"report.md": invented("server_peak_rss_mb", 10.0)}),
    # the course's static-batching server (mounted for the judge's baseline) served as the learner's: it passed
    # greedy-outputs, blocks-freed and disconnect-frees; the judge's reading of server.py refuses it
    "server that re-exports the course's static batcher": ("greedy-outputs", {"server.py": (
        "from infracourse.kit.static_server import app  # noqa: F401\n")}),
}

# what a variant's message must say
REASON = {"server that re-exports the course's static batcher": "reaches infracourse.kit.static_server"}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    """Graded on its check alone (and what it requires): the grade runs only the phases that check reads
    (PHASE_CHECKS), as `infracourse grade week17 --check ID` does. The table's third item names other checks
    that may see the same mistake too; they are not graded here."""
    check_id, edits, *_ = VARIANTS[name]
    check = assert_variant_fails(grade_lab, "week17", check_id, edits)
    assert REASON.get(name, "") in check.message, check.message


# issue 31's load matrix: each wrong matrix fails load-matrix, saying what is wrong
MATRIX_VARIANTS = {
    "a cell skipped": (skip_cell, "cell in16-out4-r32-b1: missing"),
    "TTFT halved, not from the records": (halve_ttft, "cell in16-out16-c4: metrics.ttft_ms"),
    "the 4-user cell copied from the 1-user cell": (one_user_as_four, "at most 1 request(s) in flight"),
    "a server faster than the course's runner allows": (faster_server, "faster than any server through the course"),
}


@pytest.mark.parametrize("name", list(MATRIX_VARIANTS))
def test_wrong_load_matrix_fails_its_check(grade_lab, name):
    change, says = MATRIX_VARIANTS[name]
    check = assert_variant_fails(grade_lab, "week17", "load-matrix", matrix_edits(change))
    assert says in check.message, check.message


def test_report_in_other_words_passes(grade_lab):
    _, checks = grade_lab("week17", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def with_matrix_figures_of(folder: Path):
    """An edit of report.md: its matrix_* figures as bench.py prints them from `folder`/matrix/matrix.json."""
    m = {row["file"].removesuffix(".json"): row["metrics"]
         for row in json.loads((folder / "matrix" / "matrix.json").read_text())["cells"]}
    heavy, one, bursty = m["in64-out16-c4"], m["in64-out16-c1"], m["in64-out16-r32-b0.25"]
    figures = {"matrix_heaviest_output_tokens_per_s": heavy["output_throughput"],
               "matrix_heaviest_ttft_p99_ms": heavy["ttft_ms"]["p99"],
               "matrix_concurrency_gain": heavy["output_throughput"] / one["output_throughput"],
               "matrix_bursty_ttft_p99_ms": bursty["ttft_ms"]["p99"]}

    def edit(report: str) -> str:
        lines = report.splitlines()
        for name, value in figures.items():
            at = [i for i, line in enumerate(lines) if line.startswith(f"{name}:")]
            assert len(at) == 1, name
            lines[at[0]] = f"{name}: {value:.6g}"
        return "\n".join(lines) + "\n"
    return edit


@pytest.mark.parametrize("folder", ["week17-honest", "week17-b-honest"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, folder):
    """An honest engine, server and bench.py with the matrix that bench wrote against that server: week17-honest
    (the matrix's cells listed by hand in another order, seeds from 1000, matrix.json and a two-panel plot written
    by hand) with the lab's report, its matrix figures as that bench printed them; week17-b-honest also with the
    records.json of its load point and its own report.md, the figures block as its bench printed it."""
    honest = FIXTURES / folder
    edits = {str(p.relative_to(honest)): p.read_bytes() if p.suffix == ".png" else p.read_text()
             for p in sorted(honest.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
    edits["report.md"] = (with_stamped_environment(edits["report.md"]) if "report.md" in edits
                          else with_matrix_figures_of(honest))
    assert_solution_passes(grade_lab, machine, "week17", edits=edits)


def test_runner_journal_gives_each_requests_stays(tmp_path, monkeypatch):
    """The course's ModelRunner journals each step's pieces; the judge's residencies() reads, per request, each
    stay in the batch: a recomputation from position 0 opens a second one (a preemption)."""
    from infracourse.kit.batching import ModelRunner, Piece, ServeConfig
    from infracourse.kit.loadgen import RequestSpec
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "graders" / "week17"))
    from week17_judging import read_journal, residencies
    journal = tmp_path / "steps.jsonl"
    runner = ModelRunner(ServeConfig(num_blocks=8, block_size=4, step_journal=str(journal)))
    runner.step([Piece([1, 5, 6], 0, [0]), Piece([2, 7], 0, [1])])       # both prefilled
    runner.step([Piece([9], 3, [0]), Piece([3], 2, [1])])                # both decode
    runner.step([Piece([4], 4, [0, 3])])                                 # request 1 preempted
    runner.step([Piece([2, 7, 3], 0, [1]), Piece([8], 5, [0, 3])])        # request 1 recomputed, in block 1 again
    runner.step([Piece([5], 3, [1])])
    steps = read_journal(journal)
    assert [[len(t) for _, t, _ in s] for s in steps] == [[3, 2], [1, 1], [1], [3, 1], [1]]
    stays = residencies(steps, [RequestSpec([1, 5, 6], 4), RequestSpec([2, 7], 4)])
    assert stays == {0: [[0, 3]], 1: [[0, 1], [3, 4]]}


def _throughput_verdict(monkeypatch, *, ratio, occupancy, pace, contention, threshold=3.0):
    """test_throughput_against_static_batching on a grade whose load point gave `ratio` (throughput over static
    batching's), `occupancy` (sequences decoding at once over static's) and `pace` (time per output token over
    the step floor) on a machine with `contention` runnable tasks per core; returns the failure message or None."""
    import importlib
    import sys

    from infracourse.failures import LabCheckFailed
    from infracourse.grading.serving import Phase
    from infracourse.kit.batching import ServeConfig

    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "graders" / "week17"))
    sys.modules.pop("test_throughput", None)
    check = importlib.import_module("test_throughput")
    monkeypatch.setattr(check, "_attempts", [])
    floor_ms = 12.0
    static = {"output_throughput": 100.0, "decoding_at_once": 4.0, "ttft_ms": {"p99": 500.0},
              "tpot_ms": {"mean": floor_ms}}
    mine = {"output_throughput": 100.0 * ratio, "decoding_at_once": 4.0 * occupancy, "ttft_ms": {"p99": 400.0},
            "tpot_ms": {"mean": floor_ms * pace}}
    monkeypatch.setattr(check, "load_point", lambda server, seed, who: static)
    monkeypatch.setattr(check, "cpu_contention", lambda: contention)
    served = type("Served", (), {"phases": {"load": Phase(data={"metrics": mine})}, "seed": 1,
                                 "cfg": ServeConfig(max_num_seqs=16, step_floor_ms=floor_ms)})
    try:
        check.test_throughput_against_static_batching(served, None, None, type("C", (), {"threshold": threshold}),
                                                      lambda *a, **k: None)
    except LabCheckFailed as exc:
        return str(exc)
    finally:
        sys.modules.pop("test_throughput", None)  # a grader module, not one of this suite's
    return None


@pytest.mark.parametrize("ratio, occupancy, pace, contention, passes, says", [
    (3.2, 3.4, 1.02, 1.0, True, None),              # an idle machine, the wall clock meets the 3x bar
    (2.1, 3.4, 1.40, 3.0, True, None),              # busy, slow steps, a full batch: occupancy stands in
    (1.9, 3.4, 1.40, 3.0, False, "grade again"),    # busy and full, but the wall clock is under its 2x floor
    (2.1, 3.4, 1.40, 1.0, False, "profile one step"),    # slow steps on an idle machine: the learner's loop
    (2.1, 2.5, 1.40, 3.0, False, "a fuller batch"),      # busy, but the batch is not 3x static's
    (2.1, 3.4, 1.05, 3.0, False, "at least 3x"),         # busy, but the steps kept the floor: no excuse
])
def test_a_busy_machine_lets_occupancy_stand_in_only_for_a_full_batch_of_slow_steps(
        monkeypatch, ratio, occupancy, pace, contention, passes, says):
    """Issue 29: week 17's busy fallback. The occupancy ratio replaces the wall-clock one only where the machine
    was busy, the learner's steps ran measurably over the floor, the batch was full, and the wall clock still
    reached WALL_FLOOR; otherwise the low ratio fails, and the message names what the figures point at."""
    message = _throughput_verdict(monkeypatch, ratio=ratio, occupancy=occupancy, pace=pace, contention=contention)
    assert (message is None) == passes, message
    if says:
        assert says in message, message


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # the grading plugin registers `timing`
def test_the_judges_rerun_forgives_a_busy_machine_and_not_a_copied_cell(monkeypatch):
    """load-matrix's comparison of a re-run cell (compare_rerun), on the solution's stored figures: a judge's run
    3x slower passes where the machine was busy 3x (load moved it) and fails where it was idle; the one-user
    cell's records filed as the four-user cell's (whose records alone already fail: test_wrong_load_matrix...)
    give a gain of 1, which fails however busy the machine (load never makes the judge's gain larger)."""
    import copy
    import importlib
    import sys

    from infracourse.failures import LabCheckFailed

    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "graders" / "week17"))
    sys.modules.pop("test_matrix", None)
    check = importlib.import_module("test_matrix")
    try:
        stored = {row["file"].removesuffix(".json"): row["metrics"]
                  for row in json.loads((MATRIX / "matrix.json").read_text())["cells"]}
        four, one = stored["in64-out16-c4"], stored["in64-out16-c1"]
        slower = copy.deepcopy(four)
        slower["output_throughput"] /= 3
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            slower[key] = {stat: value * 3 for stat, value in four[key].items()}
        recorded = {}

        def record(name, value, target=None, unit=""):
            recorded[name] = (value, target)

        check.compare_rerun(check.HEAVIEST, four, slower, 3.0, record)
        assert recorded["in64-out16-c4 output tokens per s"] == (four["output_throughput"], slower["output_throughput"])
        with pytest.raises(LabCheckFailed, match="in64-out16-c4 gives output tokens per s"):
            check.compare_rerun(check.HEAVIEST, four, slower, 1.0, record)
        # the copy: its gain is 1, the judge's what 4 users really buy, below which no load widens anything
        gain = four["output_throughput"] / one["output_throughput"]
        check.compare_gain(gain, gain, 3.0, record)
        with pytest.raises(LabCheckFailed, match="4 users buy 1.00x"):
            check.compare_gain(1.0, gain, 3.0, record)
    finally:
        sys.modules.pop("test_matrix", None)  # a grader module, not one of this suite's


def _judging(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "graders" / "week17"))
    import week17_judging
    return week17_judging


def test_gpu_check_is_blocked_without_cuda_naming_the_hardware(grade_lab, machine):
    """Graded alone on a machine without CUDA, gpu-continuous-batching is blocked (never failed or passed), and
    the reason names the hardware it needs."""
    if machine.gpu_count:
        pytest.skip("this machine has a GPU: the check runs here")
    _, checks = grade_lab("week17", checks=["gpu-continuous-batching"])
    check = checks["gpu-continuous-batching"]
    assert check.status == "blocked" and "cuda" in check.message.lower(), (check.status, check.message)


GIB = 2**30
FORMULA = 2 * 4 * 8 * 128 * 96 * 8 * 2    # 4 layers, 8 KV heads of 128, 96 blocks of 8, bf16
WEIGHTS = int(1.75 * GIB)


def _device_figures(**change) -> dict:
    return {"source": "device", "kv_pool_bytes": FORMULA, "weights_bytes": WEIGHTS + 4096,
            "max_allocated": WEIGHTS + FORMULA + 300 * 2**20, **change}


@pytest.mark.parametrize("figures, delta, says", [
    (_device_figures(), 3 * GIB, None),                                       # the device's own figures
    (_device_figures(kv_pool_bytes=FORMULA + 1024), 3 * GIB, None),           # K and V rounded up to 512 bytes
    (None, 3 * GIB, "wrote no memory figures"),                               # the runner's report never written
    (_device_figures(source="cpu-stand-in"), 3 * GIB, "host memory"),         # host memory where device is asked
    (_device_figures(kv_pool_bytes=2 * FORMULA), 3 * GIB, "not the model's dtype"),   # an fp32 pool
    (_device_figures(weights_bytes=0, max_allocated=FORMULA), 3 * GIB, "not on the device"),
    (_device_figures(), 100 * 2**20, "not the device's"),                     # the judge saw the device hold less
    (_device_figures(kv_pool_bytes=float(FORMULA)), 3 * GIB, "byte counts"),
])
def test_gpu_memory_figures_must_be_the_devices(monkeypatch, figures, delta, says):
    """week17_judging.check_device_memory, the GPU check's memory verdict, fed figures on a CPU: the runner's
    allocator figures pass where they equal the formula at bf16 and the judge's reading of the device covers
    them; figures of host memory, of another pool, or not seen on the device fail, saying which."""
    judging = _judging(monkeypatch)
    from infracourse.failures import WrongOutput
    if says is None:
        judging.check_device_memory(figures, formula=FORMULA, weights=WEIGHTS, device_delta=delta, what="w")
        return
    with pytest.raises(WrongOutput, match=says):
        judging.check_device_memory(figures, formula=FORMULA, weights=WEIGHTS, device_delta=delta, what="w")


def test_gpu_comparison_with_static_batching_and_the_runners_journal(monkeypatch):
    """compare_with_static: the ratio at the threshold passes, under it fails, and a throughput bought with P99
    TTFT worse than static's (beyond the slack) fails; tokens_through_runner: a server that streamed more tokens
    than the runner's journal holds pieces computed them elsewhere."""
    judging = _judging(monkeypatch)
    from infracourse.kit.loadgen import RequestRecord
    static = {"output_throughput": 1000.0, "ttft_ms": {"p99": 800.0}}
    assert judging.compare_with_static({"output_throughput": 2000.0, "ttft_ms": {"p99": 300.0}}, static, 2.0) is None
    assert "1.90x, at least 2x" in judging.compare_with_static(
        {"output_throughput": 1900.0, "ttft_ms": {"p99": 300.0}}, static, 2.0)
    assert "time to first token" in judging.compare_with_static(
        {"output_throughput": 5000.0, "ttft_ms": {"p99": 1100.0}}, static, 2.0)
    records = [RequestRecord(8, 0.0, [0.1, 0.2, 0.3], success=True), RequestRecord(8, 0.0, [0.1], success=True)]
    steps = [[[0, [1, 2], [0]], [0, [3], [1]]], [[2, [9], [0]]], [[3, [9], [0]]]]      # 4 pieces, 4 tokens
    assert judging.tokens_through_runner(steps, records) is None
    assert "only 3 pieces" in judging.tokens_through_runner(steps[:2], records)


def test_floored_figures_say_they_are_the_stand_in(monkeypatch):
    """On a CPU every serving figure of greedy-outputs and throughput-vs-static is labelled the 12 ms floor's
    stand-in (source cpu-stand-in); with no floor on a GPU the figures are the device's."""
    import dataclasses
    import importlib
    import sys

    from infracourse.grading.serving import Phase
    from infracourse.kit import batching
    judging = _judging(monkeypatch)
    cpu = batching.bench_config("cpu")
    assert judging.stand_in(cpu)["source"] == "cpu-stand-in" and "12 ms step floor" in judging.stand_in(cpu)["label"]
    assert judging.stand_in(dataclasses.replace(cpu, device="cuda", step_floor_ms=0.0)) == {"source": "device"}
    sys.modules.pop("test_outputs", None)
    check = importlib.import_module("test_outputs")
    try:
        monkeypatch.setattr(check, "check_outputs", lambda *a: None)
        percentiles = {"p50": 1.0, "p95": 2.0, "p99": 3.0}
        metrics = {"ttft_ms": percentiles, "tpot_ms": percentiles, "e2el_ms": percentiles, "request_throughput": 9.0,
                   "output_throughput": 90.0, "request_goodput": 8.0, "completed": 10, "failed": 0,
                   "total_output": 100, "duration_s": 1.0}
        from infracourse.kit.loadgen import RequestRecord
        load = {"records": [RequestRecord(8, 0.0, [0.1], success=True)], "specs": [], "metrics": metrics, "rss_mb": 300.0, "device_mb": None,
                "contention": 1.0}
        served = type("Served", (), {"phases": {"load": Phase(data=load)}, "seed": 1, "cfg": cpu})
        figures = {}
        check.test_greedy_outputs(served, None, lambda name, value, **kw: figures.update({name: kw}))
    finally:
        sys.modules.pop("test_outputs", None)
    serving = {name: kw for name, kw in figures.items() if name != "cpu contention (grader)"}
    assert len(serving) >= 12 and all(kw.get("source") == "cpu-stand-in" for kw in serving.values()), figures


@pytest.mark.slow
@pytest.mark.solutions  # a learner release leaves the handout solutions out
def test_solution_written_from_the_handout_alone_passes(grade_lab, machine):
    """engine.py, server.py and bench.py by someone who read only the handout, the starter, lab.yaml and the kit
    modules it names (tests/fixtures/week17-handout), with the records.json and matrix/ that bench.py wrote against
    that server and the figures block it printed (the report's prose is the lab's: it never failed)."""
    assert_solution_passes(grade_lab, machine, "week17", edits=handout_solution("week17"))
