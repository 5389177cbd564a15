"""Week 3 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
from reportproof import invented, reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week03")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week03", source="starter", stamp=False)
    assert not result.complete
    assert "build the (B, L_max) batch" in checks["schemes-correct"].message
    assert "serve the requests" in checks["littles-law"].message
    assert checks["effective-gain"].status == "failed"
    assert "attribute the trace's span" in checks["timeline"].message
    assert "NotImplementedError" in checks["reproduces"].message and "empty folder" in checks["reproduces"].message


SCHEMES, EXPERIMENT = "schemes.py", "experiment.py"
VARIANTS = {
    # padding positions counted as useful work
    "useful tokens counted with padding": ("utilisation-reported", EXPERIMENT, replace_once(
        "useful += sum(len(s) for s in seqs)", "useful += tokens.numel()")),
    # latency timed from when the server picked the request up: the queueing is lost
    "latency excludes queueing": ("littles-law", EXPERIMENT, replace_once(
        "latencies.append(time.perf_counter() - submitted)", "latencies.append(time.perf_counter() - started)")),
    # unpack keeps one position too many
    "unpack off by one": ("schemes-correct", SCHEMES, replace_once(
        "[logits[i, :n] for i, n in enumerate(lengths)]", "[logits[i, :n + 1] for i, n in enumerate(lengths)]")),
    # every sequence padded to the maximum length (static shapes): exact, but all the waste is back
    "pack pads to a fixed length": ("effective-gain", SCHEMES, replace_once(
        "    return torch.cat(seqs), unpack",
        "    fixed = [torch.nn.functional.pad(s, (0, 256 - len(s))) for s in seqs]\n"
        "    return torch.cat(fixed), lambda logits: [o[:n] for o, n in zip(logits.split(256), lengths)]")),
    # class 1: Little's law made an identity (throughput = clients / latency) with latency missing the queue
    "throughput derived from latency": ("littles-law", EXPERIMENT, lambda text: replace_once(
        "latencies.append(time.perf_counter() - submitted)", "latencies.append(time.perf_counter() - started)")(
        replace_once('"throughput_rps": len(latencies) / wall,',
                     '"throughput_rps": concurrency / statistics.fmean(latencies),')(text))),
    # class 1: a measure that never runs the model, its figures made up from the token counts
    "measure never runs the model": ("utilisation-reported", EXPERIMENT, replace_once(
        "        unpack(model(tokens))\n        sync()\n", "        time.sleep(1e-4)\n")),
    # class 1: a hard-coded throughput, consistent in itself (the ratio is right)
    "hard-coded throughput": ("utilisation-reported", EXPERIMENT, replace_once(
        '"useful_tokens_per_s": useful / wall,', '"useful_tokens_per_s": 5e6 * useful / computed,')),
    # class 1: raw data made up after the fact (the summary no longer recomputes from it)
    "raw samples invented": ("utilisation-reported", EXPERIMENT, replace_once(
        '"samples_s": samples,', '"samples_s": [1e-4] * len(samples),')),
    # class 1: the table's throughput invented to fit the latency, never clocked
    "table throughput invented": ("littles-law", EXPERIMENT, replace_once(
        '"throughput_rps": len(latencies) / wall,', '"throughput_rps": 2 * concurrency / statistics.fmean(latencies),')),
    # class 3: exact while checked for correctness (its first calls), then half the tokens once clocked
    "pack computes less when timed": ("effective-gain", SCHEMES, replace_once(
        "    return torch.cat(seqs), unpack",
        "    global _calls\n    _calls = globals().get('_calls', 0) + 1\n"
        "    if _calls > 12:\n        return torch.cat(seqs)[: sum(lengths) // 2], lambda logits: [\n"
        "            torch.zeros(n, logits.shape[-1]) for n in lengths]\n"
        "    return torch.cat(seqs), unpack")),
    # not reproducible: the script needs a file that is not part of the submission
    "experiment needs a file outside the submission": ("reproduces", EXPERIMENT, replace_once(
        "    args = parser.parse_args()\n", "    args = parser.parse_args()\n    import my_local_settings  # noqa: F401\n")),
    # raw data that does not back the table: p99 read off the slowest request of another run
    "table p99 not from its latencies": ("reproduces", EXPERIMENT, replace_once(
        '"p99_latency_s": float(np.percentile(latencies, 99)),', '"p99_latency_s": 2 * max(latencies),')),
    # class 2: a sabotaged pad cannot make a wasteful pack pass: the baseline is the grader's own padding
    "pad sabotaged to flatter a padding pack": ("effective-gain", SCHEMES, lambda text: replace_once(
        "    return torch.cat(seqs), unpack",
        "    fixed = [torch.nn.functional.pad(s, (0, 256 - len(s))) for s in seqs]\n"
        "    return torch.cat(fixed), lambda logits: [o[:n] for o, n in zip(logits.split(256), lengths)]")(
        replace_once("    tokens = pad_sequence(seqs, batch_first=True)",
                     "    import time; time.sleep(0.05)\n    tokens = pad_sequence(seqs, batch_first=True)")(text))),
    # the timeline: overlapping host and device time counted twice (each event's own duration summed)
    "timeline sums durations": ("timeline", EXPERIMENT, replace_once(
        "    points.sort(key=lambda p: p[0])\n",
        "    for e in events:\n        if e.get('ph') == 'X' and (kind := _class_of(e)) is not None:\n"
        "            out[BY_PRIORITY[kind]] += e['dur'] / 1e6\n    return out\n")),
    # the timeline: classes mislabelled (kernel time filed as data wait, data wait as compute)
    "timeline ranks data wait over compute": ("timeline", EXPERIMENT, replace_once(
        'BY_PRIORITY = ("compute_s", "transfer_s", "data_wait_s", "launch_s")',
        'BY_PRIORITY = ("data_wait_s", "transfer_s", "compute_s", "launch_s")')),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, file, edit = VARIANTS[name]
    assert_variant_fails(grade_lab, "week03", check_id, {file: edit})


HONEST = Path(__file__).parent / "fixtures" / "honest" / "week03"


@pytest.mark.parametrize("style", ["threads_condition", "events_barrier", "thread_pool_server"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, style):
    """Written from the handout alone, unlike the reference: a grader that fails one of them is wrong."""
    edits = {path.name: path.read_text() for path in (HONEST / style).glob("*.py")}
    assert_solution_passes(grade_lab, machine, "week03", edits=edits)


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week03", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    _, checks = grade_lab("week03", edits={"report.md": invented("pad_utilisation", 0.5)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "pad_utilisation = " in checks["report"].message and "the grader measured" in checks["report"].message


def test_clients_started_one_after_another_are_told_to_start_together(grade_lab):
    """A server measured honestly, but whose clients start one by one (here 20 ms apart, as thread start-up on a
    busy machine can be): fewer than c requests are in flight for a while, so throughput x latency falls short
    of c. The message names the cause and the fix (a barrier), which the handout asks for."""
    staggered = replace_once(
        "        ready.wait()  # all clients start together: none runs alone while the others are being created\n",
        "        time.sleep(0.02 * k)  # each client starts when its thread happens to run\n")
    _, checks = grade_lab("week03", edits={EXPERIMENT: staggered}, checks=["littles-law"])
    check = checks["littles-law"]
    assert check.status == "failed", (check.status, check.message)
    assert "Little's law" in check.message and "threading.Barrier" in check.message, check.message
