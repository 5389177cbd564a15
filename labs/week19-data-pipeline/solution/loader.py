"""A stream of batches over a list of shards, whose position can be saved and restored.

The position is one number: how many samples of this epoch the loader has handed out. Shards and their sample
order are fixed by (seed, epoch), so that number says exactly which shard and which offset come next.
"""
import random

import numpy as np

from infracourse.kit.datapipe import decode_shard
from manifest import verify


class ShardedLoader:
    def __init__(self, read, manifest: dict, shards: list[str], *, batch_size: int, seed: int, epoch: int):
        self.read = read  # name -> bytes: the storage, or a cache in front of it
        self.manifest, self.shards = manifest, shards
        self.batch_size, self.seed, self.epoch = batch_size, seed, epoch
        self.position = 0  # samples of this epoch handed out so far

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "samples_seen": self.position}

    def load_state_dict(self, state: dict) -> None:
        if state["epoch"] != self.epoch:
            raise ValueError(f"a position of epoch {state['epoch']} given to a loader of epoch {self.epoch}")
        self.position = state["samples_seen"]

    def _samples(self, skip: int):
        """(id, payload) of every sample after the first `skip`, shard by shard."""
        for name in self.shards:
            count = self.manifest["shards"][name]["samples"]
            if skip >= count:  # seen already: not even read
                skip -= count
                continue
            ids, payloads = decode_shard(verify(self.manifest, name, self.read(name)))
            order = list(range(count))
            random.Random(f"{self.seed}/{self.epoch}/{name}").shuffle(order)
            for row in order[skip:]:
                yield ids[row], payloads[row]
            skip = 0

    def __iter__(self):
        batch = []
        for sample in self._samples(self.position):
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self._hand_out(batch)
                batch = []
        if batch:  # the last, partial batch: every sample is seen once per epoch
            yield self._hand_out(batch)

    def _hand_out(self, batch):
        self.position += len(batch)  # counted when the batch leaves: a checkpoint taken now includes it
        ids, payloads = zip(*batch)
        return np.array(ids, dtype=np.int64), np.stack(payloads)
