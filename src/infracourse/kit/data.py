"""Week 2's fixed pieces: a synthetic image dataset on disk in two layouts, and the small model it feeds.

The dataset is generated from a seed on this machine (nothing is downloaded) and written twice:
    files/000123.npy   one small file per sample, like a folder of JPEGs: an open() and a parse per sample
    packed.npy         every sample in one array, which np.load can memory-map: one open() for the dataset
    labels.npy         the class of every sample, shared by both layouts
It is written once under the course cache (INFRACOURSE_CACHE) and reused. The model is cheap on purpose:
the week is about feeding it, and a model that cheap makes a slow input pipeline impossible to miss.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from infracourse.hardware import cache_dir


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


class StepLoop:
    """Training steps fed by a learner's loader, built in the grading worker: `make_loader(root, read,
    batch_size, workers)` is the learner's, the model and the step are the course's. A call runs `steps` steps
    (fetch a batch, copy it to the device, train, wait for the device), so the grader can clock whole calls
    from its own process; `close()` drops the loader, which stops its persistent workers."""

    def __init__(self, make_loader, root, read: str, batch_size: int, workers: int, device: str):
        self.device = device
        self.model, self.optimizer = new_trainer(device)
        self.loader = make_loader(root, read, batch_size, workers)
        self.batches = iter(self.loader)

    def __call__(self, steps: int = 1) -> int:
        for _ in range(steps):
            try:
                batch = next(self.batches)
            except StopIteration:  # a new epoch (the grader's median keeps the restart out of the figure)
                self.batches = iter(self.loader)
                batch = next(self.batches)
            train_step(self.model, self.optimizer, *to_device(tuple(batch), self.device))
        if self.device == "cuda":
            torch.cuda.synchronize()
        return steps

    def close(self) -> None:
        self.batches = self.loader = None
