"""Week 2: two ways to read the same dataset, and the DataLoader that feeds the model (reference solution)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

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
    """Every sample in one memory-mapped array, read a whole batch at a time: __getitem__ takes a list of
    indices and returns the stacked batch, so a batch costs one gather instead of B file reads."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.labels = np.load(self.root / "labels.npy")
        self.images = None  # opened on first use, in whichever process reads: workers map the file themselves

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, indices: list[int]):
        if self.images is None:
            self.images = np.load(self.root / "packed.npy", mmap_mode="r")
        # Fancy indexing copies the rows out of the mapping (consecutive indices: one contiguous read).
        return torch.from_numpy(self.images[indices]), torch.from_numpy(self.labels[indices])


def make_loader(root: Path, read: str, batch_size: int, workers: int) -> DataLoader:
    """Batches (images (B, 3, 32, 32) uint8, labels (B,) int64) in dataset order, full batches only."""
    common = dict(num_workers=workers, persistent_workers=workers > 0,  # no worker restart between epochs
                  pin_memory=torch.cuda.is_available())  # page-locked batches copy to the GPU asynchronously
    if read == "file":
        return DataLoader(FileDataset(root), batch_size=batch_size, drop_last=True, **common)
    if read == "packed":
        dataset = PackedDataset(root)
        # batch_size=None: the sampler yields whole lists of indices and the dataset returns whole batches
        batches = BatchSampler(SequentialSampler(dataset), batch_size, drop_last=True)
        return DataLoader(dataset, sampler=batches, batch_size=None, **common)
    raise ValueError(f"read must be 'file' or 'packed', not {read!r}")
