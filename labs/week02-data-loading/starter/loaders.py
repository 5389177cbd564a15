"""Week 2: two ways to read the same dataset, and the DataLoader that feeds the model.

FileDataset (one file per sample) is given: it is the naive baseline. Write PackedDataset and the packed
branch of make_loader. `infracourse grade week02` checks both read methods deliver the dataset exactly.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from infracourse.kit.data import sample_path


class FileDataset(Dataset):
    """One .npy file per sample: every sample costs an open(), a header parse and a small read."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.labels = np.load(self.root / "labels.npy")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return torch.from_numpy(np.load(sample_path(self.root, index))), int(self.labels[index])


class PackedDataset(Dataset):
    """Every sample in one memory-mapped array (root / 'packed.npy'), read a whole batch at a time."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.labels = np.load(self.root / "labels.npy")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, indices: list[int]):
        # TODO(week02): map packed.npy (np.load with mmap_mode="r", once per process) and return the batch
        # (images (B, 3, 32, 32) uint8 tensor, labels (B,) int64 tensor) for these indices.
        raise NotImplementedError("PackedDataset.__getitem__(): read a whole batch from the memory-mapped packed.npy")


def make_loader(root: Path, read: str, batch_size: int, workers: int) -> DataLoader:
    """Batches (images (B, 3, 32, 32) uint8, labels (B,) int64) in dataset order, full batches only."""
    if read == "file":
        return DataLoader(FileDataset(root), batch_size=batch_size, num_workers=workers, drop_last=True)
    if read == "packed":
        # TODO(week02): a DataLoader whose sampler yields lists of batch_size indices (BatchSampler) and
        # that hands each list to PackedDataset as it is (batch_size=None).
        raise NotImplementedError("make_loader(read='packed'): build the batch-at-a-time DataLoader")
    raise ValueError(f"read must be 'file' or 'packed', not {read!r}")
