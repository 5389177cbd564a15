"""Week 19: the learner's data pipeline, run by the judge in confined processes of its own (kit.datapipe's driver).

The dataset files live in a folder of the judge's that the sandbox does not show; the learner's code reaches
them only through the course's slow storage (kit.datapipe.StorageServer, a thread of this process on a Unix
socket in the scratch folder): its latency is slept here, and its count of reads is the judge's. Every task is
a fresh process, so a position restored in one was saved by another. What the processes print is evidence,
held against the dataset's seeded truth (DatasetSpec.reference_ids, payload) and the judge's clock.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from infracourse.grader import LabCheckFailed, LearnerRaised
from infracourse.kit import datapipe
from infracourse.kit.datapipe import DatasetSpec, StorageServer

WORLDS = [(2, 2), (3, 2), (2, 3), (4, 2), (1, 4), (3, 1), (5, 1), (2, 4)]  # (world_size, num_workers)


@dataclass(frozen=True)
class Plan:
    """What this grade asks, drawn from its seed: the dataset, the pipeline's seed, epoch and batch size, the
    worlds the shards are split over, where the loop is interrupted, and which shard is corrupted."""

    seed: int
    spec: DatasetSpec
    pipe_seed: int
    epoch: int
    batch_size: int
    worlds: tuple
    stop_at: tuple  # batches consumed before the checkpoint: (whole-dataset stream, one stream of a 2 x 2 world,
    #                 whose shards may be as few as one, 48 samples: 3 batches at most 20)
    corrupt: str

    def cfg(self, **extra) -> dict:
        return dict(batch_size=self.batch_size, seed=self.pipe_seed, epoch=self.epoch, **extra)


@pytest.fixture(scope="session")
def plan(seed) -> Plan:
    rng = random.Random(seed)
    spec = DatasetSpec(seed=1000 + seed % 10 ** 6, shards=rng.randint(14, 20))
    batch = rng.choice([7, 12, 13, 20])  # rarely divides a shard: a checkpoint falls inside one
    total = len(spec.reference_ids())
    worlds = [(2, 2)] + rng.sample([w for w in WORLDS if w != (2, 2)], 2)
    return Plan(seed=seed, spec=spec, pipe_seed=rng.randrange(10 ** 4), epoch=rng.randrange(3), batch_size=batch,
                worlds=tuple(worlds), stop_at=(rng.randint(3, total // batch - 3), rng.randint(1, 2)),
                corrupt=spec.shard_name(rng.randrange(spec.shards)))


class Harness:
    """Dataset copies (judge-only folders), storage servers in front of them, and driver runs."""

    def __init__(self, learner_root: Path):
        self.learner_root = Path(learner_root)
        self.base = Path(tempfile.mkdtemp(prefix="infracourse-w19-"))
        if len(str(self.base / "scratch" / "storage-99.sock")) > 100:  # a long TMPDIR (a regrade's): a short one
            self.base.rmdir()
            self.base = Path(tempfile.mkdtemp(prefix="ic19-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.scratch = self.base / "scratch"  # the confined processes' only writable folder
        self.scratch.mkdir()
        self._sockets = 0

    def copy(self, spec: DatasetSpec, name: str, *, reverse: bool = False) -> Path:
        return datapipe.write_dataset(spec, self.base / "data" / name, reverse=reverse)

    @contextlib.contextmanager
    def storage(self, root: Path, latency_s: float = 0.0):
        self._sockets += 1
        with StorageServer(root, self.scratch / f"storage-{self._sockets}.sock", latency_s) as server:
            yield server

    def run(self, server: StorageServer, spec: DatasetSpec, task: dict, what: str, timeout_s: float = 60):
        """Run a driver task against `server`; a learner failure becomes the check's failure, saying what ran."""
        run = datapipe.run_driver({**task, "socket": str(server.socket_path), "spec": asdict(spec)},
                                  snapshot=self.learner_root, scratch=self.scratch, timeout_s=timeout_s)
        if run.returncode == datapipe.NOT_WRITTEN:
            raise LearnerRaised("NotImplementedError", run.stderr.strip().splitlines()[-1].split(": ", 1)[-1])
        if run.returncode is None:
            raise LabCheckFailed(f"{what} did not finish within {timeout_s:.0f} s. A prefetch thread that died "
                                 "(its exception never handed to the consumer) or a queue nobody drains hangs the "
                                 f"loop.{_tail(run.stderr)}")
        if run.returncode != 0:
            raise LabCheckFailed(f"{what} raised an exception (exit status {run.returncode}).{_tail(run.stderr)}")
        return run

    def close(self):
        shutil.rmtree(self.base, ignore_errors=True)


def _tail(text: str, lines: int = 10) -> str:
    tail = "\n".join(text.strip().splitlines()[-lines:])
    return f" The end of its output:\n{tail}" if tail else ""


@pytest.fixture(scope="session")
def harness(learner):
    h = Harness(learner.root)
    yield h
    h.close()


def check_manifest(manifest, spec: DatasetSpec, root: Path, what: str) -> dict:
    """The manifest's shape as the handout gives it, and its sizes and counts against the files."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("version"), str) or not manifest["version"] \
            or not isinstance(manifest.get("shards"), dict):
        raise LabCheckFailed(f"{what}: a manifest is {{'version': str, 'shards': {{name: entry}}}}; got "
                             f"{json.dumps(manifest)[:200]}")
    names = sorted(p.name for p in root.iterdir())
    if sorted(manifest["shards"]) != names:
        raise LabCheckFailed(f"{what}: the manifest lists {sorted(manifest['shards'])[:4]}...; the storage holds "
                             f"{len(names)} shards {names[:4]}...: describe every shard storage.names() gives")
    layout = spec.layout()
    for name, entry in manifest["shards"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or entry.get("bytes") != (root / name).stat().st_size or entry.get("samples") != len(layout[name]):
            raise LabCheckFailed(f"{what}: the entry of {name} is {entry}; expected {{'sha256': hex string, 'bytes': "
                                 f"{(root / name).stat().st_size}, 'samples': {len(layout[name])}}}")
    return manifest


@dataclass
class Built:
    root: Path
    manifest: dict


def manifest_of(harness, spec, name: str, what: str) -> Built:
    """A copy of dataset `spec` (folder `name`) and the learner's manifest of it, checked."""
    root = harness.copy(spec, name)
    with harness.storage(root) as server:
        run = harness.run(server, spec, {"task": "manifest"}, "build_manifest(storage)")
    lines = run.results("manifest")
    if not lines:
        raise LabCheckFailed("build_manifest(storage) returned nothing the grader could read")
    return Built(root, check_manifest(lines[0]["manifest"], spec, root, what))


@pytest.fixture(scope="session")
def built(harness, plan) -> Built:
    """The grade's dataset (plan.spec) and the learner's manifest of it."""
    return manifest_of(harness, plan.spec, "main", f"build_manifest (seed {plan.seed})")


@pytest.fixture(scope="session")
def lab_built(harness) -> Built:
    """The handout's dataset (kit.datapipe.LAB) and the learner's manifest of it, for the timed checks."""
    return manifest_of(harness, datapipe.LAB, "lab", "build_manifest (the LAB dataset)")


def flat(batches) -> list[int]:
    return [i for batch in batches for i in batch]
