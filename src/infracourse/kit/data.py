"""Week 2's fixed pieces: a synthetic image dataset on disk in two layouts, and the small model it feeds.

The dataset is generated from a seed on this machine (nothing is downloaded) and written twice:
    files/000123.npy   one small file per sample, like a folder of JPEGs: an open() and a parse per sample
    packed.npy         every sample in one array, which np.load can memory-map: one open() for the dataset
    labels.npy         the class of every sample, shared by both layouts
It is written once under the course cache (INFRACOURSE_CACHE) and reused. The model is cheap on purpose:
the week is about feeding it, and a model that cheap makes a slow input pipeline impossible to miss.
"""
from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from infracourse.hardware import cache_dir, thread_run_queue_wait


@dataclass(frozen=True)
class ImageSet:
    """The synthetic dataset's shape: `samples` uint8 images of `shape` (CIFAR-sized), `classes` labels."""

    samples: int = 4096
    shape: tuple[int, int, int] = (3, 32, 32)
    classes: int = 10
    seed: int = 0

    @property
    def name(self) -> str:
        return f"images-{self.samples}-{'x'.join(map(str, self.shape))}-seed{self.seed}"

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(images (N, C, H, W) uint8, labels (N,) int64), regenerated from the seed: the truth that
        readers are checked against, independent of the files on disk."""
        rng = np.random.default_rng(self.seed)
        images = rng.integers(0, 256, size=(self.samples, *self.shape), dtype=np.uint8)
        labels = rng.integers(0, self.classes, size=self.samples, dtype=np.int64)
        return images, labels


def sample_path(root: Path, index: int) -> Path:
    """Where sample `index` lives in the one-file-per-sample layout."""
    return Path(root) / "files" / f"{index:06d}.npy"


def ensure_dataset(spec: ImageSet = ImageSet(), base: Path | None = None) -> Path:
    """The dataset's folder, written first if this machine does not have it yet."""
    base = Path(base or cache_dir() / "datasets")
    target = base / spec.name
    if target.is_dir():
        return target
    base.mkdir(parents=True, exist_ok=True)
    # Written in a private folder and renamed into place: a reader never sees half a dataset, and two
    # graders starting at once each write their own copy and one of them wins the rename.
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=".partial-"))
    images, labels = spec.arrays()
    (tmp / "files").mkdir()
    for i, image in enumerate(images):
        np.save(sample_path(tmp, i), image)
    np.save(tmp / "packed.npy", images)
    np.save(tmp / "labels.npy", labels)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class SmallNet(nn.Module):
    """The fixed model: uint8 images (B, C, 32, 32) -> class logits (B, classes). A few hundred kFLOP per sample."""

    def __init__(self, spec: ImageSet = ImageSet()):
        super().__init__()
        channels, height, width = spec.shape
        self.pool = nn.AvgPool2d(4)  # (B, C, 32, 32) -> (B, C, 8, 8)
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width // 16, 128), nn.ReLU(),
                                 nn.Linear(128, spec.classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # Decoded on the device: the batch travels as one byte per value, four times less than float32.
        x = images.float().div_(255)
        return self.mlp(self.pool(x))


def new_trainer(device: str, seed: int = 0) -> tuple[SmallNet, torch.optim.Optimizer]:
    """The model with seeded weights on `device`, and its optimiser."""
    with torch.random.fork_rng(devices=[]):  # seeded weights without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = SmallNet().to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
               labels: torch.Tensor) -> torch.Tensor:
    """One step: forward, loss, backward, update. Asynchronous on a GPU: synchronise before reading a clock."""
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def to_device(batch: tuple[torch.Tensor, ...], device: str) -> tuple[torch.Tensor, ...]:
    """The host-to-device copy of a batch (asynchronous from pinned memory on a GPU).

    On a machine without a GPU, model and data share one memory and there is nothing to transfer; the copy
    is made anyway, so the stage exists and costs what moving the batch's bytes costs, and a step splits
    into the same three parts on every machine.
    """
    if device == "cpu":
        return tuple(t.clone() for t in batch)
    return tuple(t.to(device, non_blocking=True) for t in batch)


def device_utilisation() -> float | None:
    """GPU 0's utilisation counter in percent (the share of the last sample period, 1/6 s to 1 s, in which
    any kernel was running), or None without a GPU or a way to read it. Reads NVML through torch, else asks
    nvidia-smi."""
    if not torch.cuda.is_available():
        return None
    try:
        return float(torch.cuda.utilization(0))
    except Exception:  # torch reads NVML through the optional nvidia-ml-py package
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def epoch(loader) -> list:
    """One pass over a loader, as a list of its batches (run in the grading worker on a learner's loader)."""
    return list(loader)


def batch_digest(images) -> int:
    """A checksum of a batch's images (crc32 of their bytes): a grader compares the batches a learner's code
    trained on with the dataset's own batches without sending the batches back."""
    import zlib

    array = images.detach().cpu().contiguous().numpy() if torch.is_tensor(images) else np.ascontiguousarray(images)
    return zlib.crc32(np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def dataset_batches(spec: ImageSet, batch_size: int) -> dict[int, int]:
    """{digest: k} of the dataset's full batches k (samples k*B .. (k+1)*B - 1), from the seed's arrays."""
    images, _ = spec.arrays()
    return {batch_digest(images[k * batch_size:(k + 1) * batch_size]): k for k in range(spec.samples // batch_size)}


class CourseFileDataset(torch.utils.data.Dataset):
    """The course's own per-file reader (frozen): the baseline a grader measures, never the learner's copy."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.labels = np.load(self.root / "labels.npy")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return torch.from_numpy(np.load(sample_path(self.root, index))), int(self.labels[index])


def course_file_loader(root: Path, read: str, batch_size: int, workers: int):
    """The naive baseline as the course writes it: one .npy file per sample, the default collate, in order.
    Same signature as a learner's make_loader; `read` must be "file"."""
    if read != "file":
        raise ValueError("the course's baseline loader reads one file per sample only")
    return torch.utils.data.DataLoader(CourseFileDataset(root), batch_size=batch_size, num_workers=workers,
                                       drop_last=True, persistent_workers=workers > 0)


class _StampedNet(SmallNet):
    def __init__(self, log: list, cuda: bool):
        super().__init__()
        self._log, self._cuda = log, cuda

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        import time

        entry = {"waited_before": thread_run_queue_wait(), "start": time.perf_counter(), "batch": images}
        if self._cuda:
            entry["events"] = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            entry["events"][0].record()
        self._log.append(entry)
        return super().forward(images)


class _StampedSGD(torch.optim.SGD):
    def __init__(self, params, log: list, cuda: bool, **kwargs):
        super().__init__(params, **kwargs)
        self._log, self._cuda = log, cuda

    def step(self, closure=None):
        import time

        out = super().step(closure)
        if self._log and "end" not in self._log[-1]:
            entry = self._log[-1]
            if self._cuda:
                entry["events"][1].record()
            entry["end"] = time.perf_counter()
            entry["waited_after"] = thread_run_queue_wait()
        return out


class StampedTrainer:
    """`new_trainer` as a grader hands it to a learner's sweep: `trainer(device)` returns the same seeded model
    and SGD optimiser, which keep a record of every training step they run (when its forward began and its
    optimiser step ended, on the worker's clock, and the batch it trained on). Built in the grading worker;
    `take()` returns, for each trainer made since the last take, its steps as (start_s, end_s, batch digest,
    batch size, waited_before_s, waited_after_s) and clears them. The last two are the training thread's
    run-queue wait so far (hardware.thread_run_queue_wait) at the step's start and end: what load added
    between steps, where a learner's clock of the step also runs, is their difference across the gaps.

    On a GPU the end of a step is the start stamp plus the length CUDA events measured: the wrapper adds no
    synchronise of its own, so code that forgets to wait for the device still reads a clock too early."""

    def __init__(self):
        self._runs: list[list[dict]] = []

    def __call__(self, device: str, seed: int = 0):
        log: list[dict] = []
        self._runs.append(log)
        cuda = str(device).startswith("cuda")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _StampedNet(log, cuda).to(device)
        return model, _StampedSGD(model.parameters(), log, cuda, lr=0.05)

    def take(self) -> list[list[tuple[float, float, int, int, float, float]]]:
        runs, self._runs = self._runs, []
        out = []
        for log in runs:
            steps = []
            for entry in log:
                start, end = entry["start"], entry.get("end", math.nan)
                if "events" in entry and "end" in entry:
                    entry["events"][1].synchronize()
                    end = start + entry["events"][0].elapsed_time(entry["events"][1]) / 1e3
                images = entry["batch"]
                steps.append((start, end, batch_digest(images), int(images.shape[0]) if images.dim() else 0,
                              entry["waited_before"], entry.get("waited_after", math.nan)))
            out.append(steps)
        return out


class StepLoop:
    """Training steps fed by a loader, built in the grading worker: `make_loader(root, read, batch_size,
    workers)` is the learner's (or None: the course's own per-file baseline, `course_file_loader`), the model
    and the step are the course's. A call runs `steps` steps (fetch a batch, copy it to the device, train, wait
    for the device), so the grader can clock whole calls from its own process; `digests()` gives the digest of
    every batch trained on, in order, so the grader checks the batches that were timed; `close()` drops the
    loader, which stops its persistent workers."""

    def __init__(self, make_loader, root, read: str, batch_size: int, workers: int, device: str):
        self.device = device
        self.model, self.optimizer = new_trainer(device)
        self.loader = (make_loader or course_file_loader)(root, read, batch_size, workers)
        self.batches = iter(self.loader)
        self.trained: list = []  # the batches' images, kept (not digested) so the timed steps pay nothing extra
        self.epochs = 0

    def __call__(self, steps: int = 1) -> int:
        for _ in range(steps):
            try:
                batch = next(self.batches)
            except StopIteration:  # a new epoch (the grader's median keeps the restart out of the figure)
                self.batches = iter(self.loader)
                self.epochs += 1
                self.trained.append(None)  # marks the epoch boundary
                batch = next(self.batches)
            images, labels = to_device(tuple(batch), self.device)
            self.trained.append(images)
            train_step(self.model, self.optimizer, images, labels)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return steps

    def digests(self) -> list:
        """One digest per batch trained on, in order; None where a new epoch began."""
        out = [None if images is None else batch_digest(images) for images in self.trained]
        self.trained = []
        return out

    def close(self) -> None:
        self.batches = self.loader = None
        self.trained = []


class BatchProbe:
    """A loader iterated one batch at a time by the grader (built in the grading worker), so the grader can
    change the files between two batches and see which batches change: `next()` returns the next
    (images, labels), `rest()` the remaining batches of the epoch. With 0 workers (the fetches happen in this
    process) `fetches()` says how many times the loader asked its dataset for data during the last `next()`:
    calls of `__getitem__` or `__getitems__` on the dataset's class, one for a batch read whole."""

    def __init__(self, loader):
        self.loader = loader
        self.calls = 0
        self._count_fetches(type(loader.dataset))
        self.batches = iter(loader)

    def _count_fetches(self, cls) -> None:
        for name in ("__getitem__", "__getitems__"):
            original = getattr(cls, name, None)
            if original is None:
                continue

            def counted(dataset, *args, _original=original, **kwargs):
                self.calls += 1
                return _original(dataset, *args, **kwargs)

            setattr(cls, name, counted)

    def next(self):
        self.calls = 0
        return next(self.batches)

    def fetches(self) -> int:
        return self.calls

    def rest(self) -> list:
        out = list(self.batches)
        self.batches = self.loader = None
        return out


def getitem(obj, key):
    """obj[key], run in the grading worker (a grader asks a learner's dataset for a batch of indices)."""
    return obj[key]
