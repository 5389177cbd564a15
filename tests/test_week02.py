"""Week 2 proves its grader: the solution passes, the starter fails, each wrong variant fails its check."""
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, not_passed
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

# Class 1: a sweep that writes numbers without running them (consistent with each other, plausible).
FABRICATED_SWEEP = replace_once(
    "            rows.append(run_config(root, **config, warmup=warmup, steps=steps, trainer=trainer))\n",
    "            step = 2.0 if config['read'] == 'packed' else 0.35 * config['batch_size']  # 'measured earlier'\n"
    "            rows.append({**config, 'warmup': warmup, 'steps': steps, 'step_ms': step,\n"
    "                         'samples_per_s': config['batch_size'] / step * 1e3, 'data_ms': step * 0.6,\n"
    "                         'transfer_ms': step * 0.1, 'compute_ms': step * 0.3, 'cpu_percent': 80.0,\n"
    "                         'rss_mb': 400.0, 'disk_read_mb': 0.0, 'gpu_util': ''})\n")

# Class 2: the learner's FileDataset slowed (1 ms a sample in the training process), so a packed loader that
# is no faster than honest per-file reads (0.2 ms a sample) looks 5x faster against the learner's own baseline.
SLOW_BASELINE = replace_once(
    "        return torch.from_numpy(np.load(sample_path(self.root, index))), int(self.labels[index])\n",
    "        import time, torch.utils.data as tud\n"
    "        if tud.get_worker_info() is None:  # the no-worker baseline pays\n"
    "            time.sleep(1e-3)\n"
    "        return torch.from_numpy(np.load(sample_path(self.root, index))), int(self.labels[index])\n")
SLOW_PACKED = replace_once(
    "        return torch.from_numpy(self.images[indices]), torch.from_numpy(self.labels[indices])\n",
    "        import time\n"
    "        time.sleep(2e-4 * len(indices))\n"
    "        return torch.from_numpy(self.images[indices]), torch.from_numpy(self.labels[indices])\n")


VARIANTS = {
    # the transfer clock stops before the copy: the copy lands in compute
    "transfer time counted as compute": ("transfer-timed", {BENCHMARK: replace_once(
        "        images, labels = to_device(batch, device)\n"
        "        sync()  # the copy is asynchronous from pinned memory: without this wait it would land in compute\n"
        "        t2 = time.perf_counter()\n",
        "        t2 = time.perf_counter()\n        images, labels = to_device(batch, device)\n")}),
    # the step's parts start after the batch arrived: the data wait is in the step but in no part
    "data wait left out": ("step-breakdown", {BENCHMARK: replace_once(
        "        t0 = time.perf_counter()\n        batch = next(batches)",
        "        batch = next(batches)\n        t0 = time.perf_counter()")}),
    # the packed batches come in a shuffled order
    "packed batches shuffled": ("readers-correct", {LOADERS: replace_once(
        "BatchSampler(SequentialSampler(dataset)", "BatchSampler(torch.utils.data.RandomSampler(dataset)")}),
    # class 1: rows written from constants, the model never run
    "fabricated sweep": ("runs-observed", {BENCHMARK: FABRICATED_SWEEP}),
    # class 1: the data wait booked as compute (parts still add up to the step)
    "data wait booked as compute": ("runs-observed", {BENCHMARK: replace_once(
        "data, transfer, compute = data + t1 - t0, transfer + t2 - t1, compute + t3 - t2",
        "data, transfer, compute = data, transfer + t2 - t1, compute + t3 - t2 + t1 - t0")}),
    # class 1: resident memory written as a constant (a 'typical' figure, not this process's)
    "memory a constant": ("resources", {BENCHMARK: replace_once("return total / 2**20", "return 50.0")}),
    # class 2: the baseline sabotaged in the learner's own FileDataset
    "sabotaged baseline": ("speedup", {LOADERS: lambda text: SLOW_PACKED(SLOW_BASELINE(text))}),
    # class 3: correct at the batch sizes checked, a cached batch at CHOSEN's (the timed one)
    "cached batch at the timed size": ("speedup", {LOADERS: replace_once(
        "        return torch.from_numpy(self.images[indices]), torch.from_numpy(self.labels[indices])\n",
        "        if len(indices) == 512:  # the batch size that is timed, never the one that is checked\n"
        "            indices = list(range(512))\n"
        "        return torch.from_numpy(self.images[indices]), torch.from_numpy(self.labels[indices])\n")}),
    # class 4: the right batches, but packed.npy read whole into memory instead of mapped
    "packed file read into memory": ("packed-mapped", {LOADERS: replace_once(
        'np.load(self.root / "packed.npy", mmap_mode="r")', 'np.load(self.root / "packed.npy")')}),
    # class 4: the judge's truth (kit.data.ImageSet.arrays, regenerated from the seed) returned as the packed
    # batches: readers-correct passes, packed-mapped's probe dataset, whose packed.npy differs, does not
    "packed batches from the seed's arrays": ("packed-mapped", {LOADERS: replace_once(
        '            self.images = np.load(self.root / "packed.npy", mmap_mode="r")\n',
        "            from infracourse.kit.data import ImageSet\n"
        "            self.images = ImageSet().arrays()[0]\n")}),
    # class 4: "packed" batches gathered from the per-sample files
    "packed reads the per-sample files": ("packed-mapped", {LOADERS: replace_once(
        "        return torch.from_numpy(self.images[indices]), torch.from_numpy(self.labels[indices])\n",
        "        images = np.stack([np.load(sample_path(self.root, i)) for i in indices])\n"
        "        return torch.from_numpy(images), torch.from_numpy(self.labels[indices])\n")}),
    # class 4: the right batches from the map, but fetched one sample at a time and collated
    "packed loader fetching one sample at a time": ("packed-mapped", {LOADERS: replace_once(
        "        batches = BatchSampler(SequentialSampler(dataset), batch_size, drop_last=True)\n"
        "        return DataLoader(dataset, sampler=batches, batch_size=None, **common)\n",
        "        class OneAtATime(PackedDataset):\n"
        "            def __getitem__(self, i):\n"
        "                x, y = super().__getitem__([i])\n"
        "                return x[0], y[0]\n"
        "        return DataLoader(OneAtATime(root), batch_size=batch_size, drop_last=True, **common)\n")}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check(grade_lab, name):
    check_id, edits = VARIANTS[name]
    assert_variant_fails(grade_lab, "week02", check_id, edits)


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("style", ["week02-honest", "week02-second-honest"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, style):
    """Written from the handout alone, unlike the reference (a pid-keyed open_memmap and a range sampler with
    an integer clock; a map dropped on pickling with a Stopwatch over one loop): a grader that fails one of
    them is wrong."""
    edits = {path.name: path.read_text() for path in (FIXTURES / style).glob("*.py")}
    assert_solution_passes(grade_lab, machine, "week02", edits=edits)


def test_report_in_other_words_passes(grade_lab):
    """The report check reads figures, not phrases: the solution's prose said differently still passes."""
    _, checks = grade_lab("week02", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_report_with_an_invented_figure_fails(grade_lab, machine):
    _, checks = grade_lab("week02", edits={"report.md": invented("speedup_over_baseline", 100.0)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "speedup_over_baseline = " in checks["report"].message and "the grader measured" in checks["report"].message
