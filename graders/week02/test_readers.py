"""Week 2 correctness: both read methods deliver exactly the dataset, in order, with and without workers; and
the packed method is what the handout asks for, tested by its effects: whole batches from packed.npy, through a
memory map opened once per process."""
import os
import random

import numpy as np
import pytest
import torch

from infracourse.grader import LabCheckFailed
from infracourse.kit import data
from infracourse.kit.data import ImageSet


def _batch_of(batch, what):
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        raise LabCheckFailed(f"{what}: a batch must be (images, labels), got {type(batch).__name__}")
    x, y = batch
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8:
        raise LabCheckFailed(f"{what}: images must be a uint8 tensor, got {getattr(x, 'dtype', type(x))}")
    return x, y


@pytest.mark.check("readers-correct")
def test_readers_correct(loaders, root, learner, plan):
    spec = ImageSet()
    images, labels = spec.arrays()  # regenerated from the seed, not read from the files
    batch_size = plan.readers_batch  # from the run's seed: rarely a divisor of the dataset
    for read in ("file", "packed"):
        for workers in (0, 2):
            what = f"make_loader(read={read!r}, batch_size={batch_size}, workers={workers}) (seed {plan.seed})"
            # One epoch, iterated in the worker; the batches come back as data to check against the seed's arrays.
            batches = learner.build(data.epoch, loaders.make_loader(root, read, batch_size, workers))
            if not isinstance(batches, list):
                raise LabCheckFailed(f"{what} is not iterable into batches (got {type(batches).__name__})")
            if len(batches) != spec.samples // batch_size:
                raise LabCheckFailed(f"{what} gave {len(batches)} batches for one epoch of {spec.samples} samples; "
                                     f"expected {spec.samples // batch_size} full batches (drop the last partial one)")
            for i, batch in enumerate(batches):
                x, y = _batch_of(batch, f"{what}, batch {i}")
                rows = slice(i * batch_size, (i + 1) * batch_size)
                if tuple(x.shape) != (batch_size, *spec.shape):
                    raise LabCheckFailed(f"{what}, batch {i}: images must have shape {(batch_size, *spec.shape)}, "
                                         f"got {tuple(x.shape)}")
                if not np.array_equal(x.numpy(), images[rows]):
                    raise LabCheckFailed(f"{what}, batch {i}: the images are not samples {rows.start}..{rows.stop - 1} "
                                         "of the dataset, in order. Index the memory map with the batch's indices.")
                if not torch.is_tensor(y) or y.dtype != torch.int64 or not np.array_equal(y.numpy(), labels[rows]):
                    raise LabCheckFailed(f"{what}, batch {i}: the labels must be an int64 tensor equal to "
                                         f"labels[{rows.start}:{rows.stop}]")


@pytest.mark.check("packed-mapped")
def test_packed_reads_a_mapped_file(loaders, root, learner, plan):
    """The packed method by its effects. (1) PackedDataset()[indices] returns the whole batch of any list of
    indices. (2) A dataset whose packed.npy differs from its per-sample files: the packed loader must return
    packed.npy's samples. (3) After the first batch, the grader writes new bytes into packed.npy in place (a
    memory map sees them; an array read into memory does not) and then replaces the file by a new one (a map
    opened once keeps the old file; a reader that opens the file again for each batch sees the new one)."""
    spec = ImageSet()
    images, labels = spec.arrays()
    rng = random.Random(plan.seed)

    # (1) any list of indices, in any order: one call, one batch
    indices = rng.sample(range(spec.samples), 37)
    dataset = loaders.PackedDataset(root)
    got = learner.build(data.getitem, dataset, indices)
    what = f"PackedDataset(root)[indices] with 37 indices from the seed ({plan.seed}), e.g. {indices[:4]}"
    x, y = _batch_of(got, what)
    if tuple(x.shape) != (37, *spec.shape) or not np.array_equal(x.numpy(), images[indices]):
        raise LabCheckFailed(f"{what}: expected the images of exactly those samples, in that order, shape "
                             f"{(37, *spec.shape)}; got shape {tuple(x.shape)}. __getitem__ takes the whole list "
                             "of a batch's indices and returns the batch.")
    if not torch.is_tensor(y) or not np.array_equal(y.numpy(), labels[indices]):
        raise LabCheckFailed(f"{what}: the labels are not those samples' labels, in that order")

    # (2) a dataset whose two layouts differ, written by the grader in the worker's scratch
    probe = learner.worker.scratch / f"probe-{plan.seed}"
    probe.mkdir(exist_ok=True)
    np.save(probe / "labels.npy", labels)
    if not (probe / "files").exists():
        (probe / "files").symlink_to(root / "files")  # the per-sample layout as it is: the seed's images
    packed = (255 - images).astype(np.uint8)
    np.save(probe / "packed.npy", packed)
    batch_size = plan.probe_batch
    count = spec.samples // batch_size
    k, j = count - 2, count - 1  # changed in place; changed by replacing the file
    rows = lambda b: slice(b * batch_size, (b + 1) * batch_size)  # noqa: E731
    what = f"make_loader(probe, 'packed', batch_size={batch_size}, workers=0) (seed {plan.seed})"
    loader = loaders.make_loader(probe, "packed", batch_size, 0)
    batches = learner.build(data.BatchProbe, loader)
    first, _ = _batch_of(batches.next(), f"{what}, batch 0")
    if np.array_equal(first.numpy(), images[rows(0)]):
        raise LabCheckFailed(f"{what}: batch 0 holds the per-sample files' images, but this dataset's packed.npy "
                             "holds other values: the packed method must read packed.npy")
    if not np.array_equal(first.numpy(), packed[rows(0)]):
        raise LabCheckFailed(f"{what}: batch 0 is not samples 0..{batch_size - 1} of packed.npy")
    fetches = batches.fetches()
    if fetches != 1:
        raise LabCheckFailed(f"{what}: batch 0 took {fetches} calls into your dataset (__getitem__ / "
                             f"__getitems__), one per sample: the packed method reads a whole batch at a time. "
                             "Hand the dataset each batch's list of indices (a BatchSampler as the sampler, "
                             "batch_size=None) so one gather from the map makes the batch")

    # (3) in place, then replace
    mapped = np.load(probe / "packed.npy", mmap_mode="r+")
    mapped[rows(k)] ^= 0x5A
    mapped.flush()
    del mapped
    after_write = packed.copy()
    after_write[rows(k)] ^= 0x5A
    replacement = after_write.copy()
    replacement[rows(j)] ^= 0xA5
    np.save(probe / "packed-new.npy", replacement)
    os.replace(probe / "packed-new.npy", probe / "packed.npy")
    rest = batches.rest()
    if not isinstance(rest, list) or len(rest) != count - 1:
        raise LabCheckFailed(f"{what}: expected {count - 1} more batches after the first, got "
                             f"{len(rest) if isinstance(rest, list) else type(rest).__name__}")
    for b, batch in enumerate(rest, start=1):
        x, _ = _batch_of(batch, f"{what}, batch {b}")
        x = x.numpy()
        if b == k and np.array_equal(x, packed[rows(k)]):
            raise LabCheckFailed(
                f"{what}: the grader wrote new bytes into packed.npy (batch {k}) after batch 0, and your loader still "
                "returned the old ones: the file was read into memory, not memory-mapped. Open it with "
                "np.load(path, mmap_mode='r') so a batch costs only the pages it touches.")
        if b == j and np.array_equal(x, replacement[rows(j)]):
            raise LabCheckFailed(
                f"{what}: the grader replaced packed.npy by a new file after batch 0, and batch {j} came from the new "
                "file: your loader opens the file again for each batch. Map it once per process (on first use) "
                "and keep the map.")
        if not np.array_equal(x, after_write[rows(b)]):
            raise LabCheckFailed(f"{what}, batch {b}: not samples {rows(b).start}..{rows(b).stop - 1} of packed.npy "
                                 "as mapped")
