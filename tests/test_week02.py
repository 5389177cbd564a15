"""Week 2 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails
from reportproof import invented, reworded

pytestmark = pytest.mark.slow


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week02")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week02", source="starter", stamp=False)
    assert not result.complete
    assert "build the batch-at-a-time DataLoader" in checks["readers-correct"].message
    assert "write results.csv" in checks["csv-complete"].message
    assert checks["speedup"].status == "failed"


LOADERS, BENCHMARK = "loaders.py", "benchmark.py"
VARIANTS = {
    # packed reads with workers skipped, as if a memory map could not gain from them
    "CSV missing configurations": ("csv-complete", BENCHMARK, replace_once(
        "        for config in configs:\n",
        '        for config in [c for c in configs if not (c["read"] == "packed" and c["workers"])]:\n')),
    # the transfer clock stops before the copy: the copy lands in compute
    "transfer time counted as compute": ("transfer-timed", BENCHMARK, replace_once(
        "        images, labels = to_device(batch, device)\n"
        "        sync()  # the copy is asynchronous from pinned memory: without this wait it would land in compute\n"
        "        t2 = time.perf_counter()\n",
        "        t2 = time.perf_counter()\n        images, labels = to_device(batch, device)\n")),
    # the step's parts start after the batch arrived: the data wait is in the step but in no part
    "data wait left out": ("step-breakdown", BENCHMARK, replace_once(
        "        t0 = time.perf_counter()\n        batch = next(batches)",
        "        batch = next(batches)\n        t0 = time.perf_counter()")),
    # resident memory in bytes under a MiB column
    "memory in bytes": ("resources", BENCHMARK, replace_once("return total / 2**20", "return total")),
    # the packed batches come in a shuffled order
    "packed batches shuffled": ("readers-correct", LOADERS, replace_once(
        "BatchSampler(SequentialSampler(dataset)", "BatchSampler(torch.utils.data.RandomSampler(dataset)")),
    # CHOSEN left at the naive baseline
    "chosen is the baseline": ("speedup", BENCHMARK, replace_once(
        'CHOSEN = {"read": "packed", "batch_size": 512, "workers": 0}',
        'CHOSEN = {"read": "file", "batch_size": 512, "workers": 0}')),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, file, edit = VARIANTS[name]
    assert_variant_fails(grade_lab, "week02", check_id, {file: edit})


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week02", edits={"report.md": reworded})
    assert checks["report"].status == "passed", checks["report"].message


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    _, checks = grade_lab("week02", edits={"report.md": invented("speedup_over_baseline", 10.0)})
    assert checks["report"].status == "failed"
    assert "speedup_over_baseline = " in checks["report"].message and "the grader measured" in checks["report"].message
