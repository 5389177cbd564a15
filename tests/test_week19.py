"""Week 19 proves its grader: the solution passes, the starter fails every check saying what to write, each
wrong variant the issue names fails its own check (and only it, of the checks it requires), and honest
solutions in other styles pass: tests/fixtures/week19-honest (a generator loader
whose position is (shard, offset), contiguous shard blocks per stream, read-ahead of shards on a thread pool
instead of a batch queue, a cache named by shard that re-checks its copy) and tests/fixtures/week19-b-honest
(a class-based iterator with __next__, streams numbered worker-major, a Condition-guarded deque as the
prefetch queue, a cache written with exclusive create and rename)."""
import hashlib
import json
from pathlib import Path

import pytest

from conftest import replace_once
from labproof import assert_solution_passes, assert_variant_fails, handout_solution, not_passed
from reportproof import invented, reworded

from infracourse.kit import datapipe

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"
SOLUTION = Path(__file__).parent.parent / "labs" / "week19-data-pipeline" / "solution"


def test_solution_passes_every_check_this_machine_can_run(grade_lab, machine):
    assert_solution_passes(grade_lab, machine, "week19")


def test_starter_fails_and_says_what_to_do(grade_lab):
    result, checks = grade_lab("week19", source="starter", stamp=False)
    assert not result.complete
    assert all(c.status == "failed" for c in checks.values()), {c.id: (c.status, c.message) for c in checks.values()}
    for check in ("shards-disjoint", "resume-exact", "manifest-hash", "stream-memory", "prefetch-hides-latency",
                  "cache-hits"):
        assert "not written yet" in checks[check].message and "build_manifest" in checks[check].message
    assert "python experiment.py" in checks["version-reproducible"].message
    assert "in your own words" in checks["report"].message


def run_json_for(shard_hash) -> str:
    """The solution's run.json as experiment.py would write it with another shard hash (the order is the same)."""
    shards = {}
    for name, ids in datapipe.LAB.layout().items():
        data = datapipe.encode_shard(datapipe.LAB, ids)
        shards[name] = {"sha256": shard_hash(name, data), "bytes": len(data), "samples": len(ids)}
    record = json.loads((SOLUTION / "run.json").read_text())
    record["dataset_version"] = hashlib.sha256(
        json.dumps(shards, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return json.dumps(record)


SYNC_PREFETCH = """    def __iter__(self):
        for batch in self.loader:  # no thread: each read still waits in the loop
            self._state = self.loader.state_dict()
            yield batch
"""

VARIANTS = {
    "resume repeats a batch": ("resume-exact", {"loader.py": replace_once(
        'self.position = state["samples_seen"]', 'self.position = max(0, state["samples_seen"] - self.batch_size)')}),
    "resume skips: the prefetcher saves its loader's position": ("resume-exact", {"prefetch.py": replace_once(
        "        return self._state\n", "        return self.loader.state_dict()\n")}),
    "workers of a rank overlap": ("shards-disjoint", {"sharding.py": replace_once(
        "    return order[stream::world_size * num_workers]", "    return order[rank::world_size]")}),
    "manifest hashes the size only": ("manifest-hash", {
        "manifest.py": replace_once("return hashlib.sha256(data).hexdigest()",
                                    "return hashlib.sha256(str(len(data)).encode()).hexdigest()"),
        "run.json": run_json_for(lambda name, data: hashlib.sha256(str(len(data)).encode()).hexdigest())}),
    "manifest hashes the name only": ("manifest-hash", {
        "manifest.py": replace_once("return hashlib.sha256(data).hexdigest()",
                                    "return hashlib.sha256(name.encode()).hexdigest()"),
        "run.json": run_json_for(lambda name, data: hashlib.sha256(name.encode()).hexdigest())}),
    "loader never checks a shard against the manifest": ("manifest-hash", {"loader.py": replace_once(
        "decode_shard(verify(self.manifest, name, self.read(name)))", "decode_shard(self.read(name))")}),
    "prefetch is synchronous": ("prefetch-hides-latency", {"prefetch.py": lambda text: (
        text[:text.index("    def __iter__(self):")] + SYNC_PREFETCH)}),
    "cache never hits": ("cache-hits", {"cache.py": replace_once("if path.exists():", "if False:")}),
    "prefetch queue without a bound": ("stream-memory", {"prefetch.py": replace_once(
        "queue.Queue(maxsize=self.depth)", "queue.Queue()")}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wrong_variant_fails_its_check_and_only_it(grade_lab, name):
    """Graded on its check and what that check requires, every one of which but the target passes. A whole grade
    also measured the report's figures: on a slow, loaded machine (2026-12-07) the report's prefetch wait failed
    beside the variant's real fault, a verdict about the machine, not the variant."""
    check_id, edits = VARIANTS[name]
    assert_variant_fails(grade_lab, "week19", check_id, edits, only=True)


def test_report_in_other_words_passes(grade_lab):
    _, checks = grade_lab("week19", edits={"report.md": reworded}, checks=["report"])
    assert checks["report"].status == "passed", not_passed(checks)


def test_invented_data_wait_fails_the_report(grade_lab):
    _, checks = grade_lab("week19", edits={"report.md": invented("data_wait_sync_s", 5.0)}, checks=["report"])
    assert checks["report"].status == "failed"
    assert "data_wait_sync_s" in checks["report"].message


@pytest.mark.parametrize("folder", ["week19-honest", "week19-b-honest"])
def test_honest_solution_in_another_style_passes(grade_lab, machine, folder):
    edits = {p.name: p.read_text() for p in (FIXTURES / folder).iterdir() if p.is_file()}
    assert_solution_passes(grade_lab, machine, "week19", edits=edits)


def test_a_shuffle_that_differs_between_processes_is_named(grade_lab):
    """hash() of a str is salted per process: a loader shuffled from it hands out another order in the process
    that resumes it. The message names that, not the saved position (which is right)."""
    salted = replace_once('random.Random(f"{self.seed}/{self.epoch}/{name}")',
                          'random.Random(hash(f"{self.seed}/{self.epoch}/{name}"))')
    result, checks = grade_lab("week19", edits={"loader.py": salted}, checks=["resume-exact"])
    check = checks["resume-exact"]
    assert check.status == "failed", (check.status, check.message)
    assert "different orders" in check.message and "hash()" in check.message, check.message
    assert "RECEIVED" not in check.message and "last batch the loop received" not in check.message
    assert not result.complete


# issue 29 class 1: a cache that is only ever read warm over data that never changes passes with stale copies.
# The judge rewrites a shard behind the warm cache between two epochs of one process: any shard, so every grade.
STALE_CACHES = {
    "cache keeps its files by shard name": replace_once(
        "path = self.folder / f\"{self.manifest['shards'][name]['sha256']}.bin\"",
        "path = self.folder / f\"{name}.bin\""),
    "cache keeps shards in the process by name": replace_once(
        "    def read(self, name: str) -> bytes:\n",
        "    kept = {}  # one per process, by shard name\n\n    def read(self, name: str) -> bytes:\n"
        "        if name in LocalCache.kept:\n            return LocalCache.kept[name]\n"
        "        LocalCache.kept[name] = self._read(name)\n        return LocalCache.kept[name]\n\n"
        "    def _read(self, name: str) -> bytes:\n"),
}


@pytest.mark.parametrize("name", list(STALE_CACHES))
def test_a_cache_that_serves_stale_bytes_fails_naming_the_shard(grade_lab, name):
    check = assert_variant_fails(grade_lab, "week19", "cache-hits", {"cache.py": STALE_CACHES[name]})
    assert "epoch 2, after the judge rewrote shard-" in check.message, check.message
    assert "stale" in check.message or "no longer match the new manifest" in check.message, check.message


@pytest.mark.slow
@pytest.mark.solutions  # a learner release leaves the handout solutions out
def test_solution_written_from_the_handout_alone_passes(grade_lab, machine):
    """every module of the pipeline and experiment.py, with the run.json that experiment.py wrote and its report: by
    someone who read only the handout, the starter, lab.yaml and the kit modules it names
    (tests/fixtures/week19-handout), never the reference or the graders."""
    assert_solution_passes(grade_lab, machine, "week19", edits=handout_solution("week19"))
