"""The shared judging helpers of the week19 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

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

    def run(self, server: StorageServer, spec: DatasetSpec, task: dict, what: str, timeout_s: float = 60,
            on_line=None):
        """Run a driver task against `server`; a learner failure becomes the check's failure, saying what ran."""
        run = datapipe.run_driver({**task, "socket": str(server.socket_path), "spec": asdict(spec)},
                                  snapshot=self.learner_root, scratch=self.scratch, timeout_s=timeout_s,
                                  on_line=on_line)
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


def flat(batches) -> list[int]:
    return [i for batch in batches for i in batch]
