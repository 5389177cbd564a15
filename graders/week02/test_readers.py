"""Week 2 correctness: both read methods deliver exactly the dataset, in order, with and without workers."""
import numpy as np
import pytest
import torch

from infracourse.grading.remote import WorkerObject
from infracourse.guard import LabCheckFailed
from infracourse.kit.data import ImageSet


@pytest.mark.check("readers-correct")
def test_readers_correct(loaders, root, learner):
    spec = ImageSet()
    images, labels = spec.arrays()  # regenerated from the seed, not read from the files
    batch_size = 256
    for read in ("file", "packed"):
        for workers in (0, 2):
            what = f"make_loader(read={read!r}, batch_size={batch_size}, workers={workers})"
            # One epoch, iterated in the worker; the batches come back as data to check against the seed's arrays.
            batches = learner.worker.build(WorkerObject("infracourse.kit.data:epoch",
                                                        (loaders.make_loader(root, read, batch_size, workers),)))
            if not isinstance(batches, list):
                raise LabCheckFailed(f"{what} is not iterable into batches (got {type(batches).__name__})")
            if len(batches) != spec.samples // batch_size:
                raise LabCheckFailed(f"{what} gave {len(batches)} batches for one epoch of {spec.samples} samples; "
                                     f"expected {spec.samples // batch_size} full batches")
            for i, batch in enumerate(batches):
                if not isinstance(batch, (list, tuple)) or len(batch) != 2:
                    raise LabCheckFailed(f"{what}, batch {i}: a batch must be (images, labels)")
                x, y = batch
                rows = slice(i * batch_size, (i + 1) * batch_size)
                if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or tuple(x.shape) != (batch_size, *spec.shape):
                    raise LabCheckFailed(f"{what}, batch {i}: images must be a uint8 tensor of shape "
                                         f"{(batch_size, *spec.shape)}, got {getattr(x, 'dtype', type(x))} "
                                         f"{tuple(getattr(x, 'shape', ()))}")
                if not np.array_equal(x.numpy(), images[rows]):
                    raise LabCheckFailed(f"{what}, batch {i}: the images are not samples {rows.start}..{rows.stop - 1} "
                                         "of the dataset, in order. Index the memory map with the batch's indices.")
                if not torch.is_tensor(y) or y.dtype != torch.int64 or not np.array_equal(y.numpy(), labels[rows]):
                    raise LabCheckFailed(f"{what}, batch {i}: the labels must be an int64 tensor equal to "
                                         f"labels[{rows.start}:{rows.stop}]")
