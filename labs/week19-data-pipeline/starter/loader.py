"""A stream of batches over a list of shards, whose position can be saved and restored."""


class ShardedLoader:
    def __init__(self, read, manifest: dict, shards: list[str], *, batch_size: int, seed: int, epoch: int):
        self.read = read  # name -> bytes: the storage, or a cache in front of it
        self.manifest, self.shards = manifest, shards
        self.batch_size, self.seed, self.epoch = batch_size, seed, epoch

    def state_dict(self) -> dict:
        """The position: JSON-serialisable plain data."""
        raise NotImplementedError("TODO (loader.py): state_dict - the position of the samples handed out so far")

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError("TODO (loader.py): load_state_dict - continue right after the saved position")

    def __iter__(self):
        """Batches (ids (B,) int64, payloads (B, P) uint8): this stream's shards in order, each verified against
        the manifest, each shard's samples shuffled from (seed, epoch); the last partial batch kept."""
        raise NotImplementedError("TODO (loader.py): __iter__ - read, verify, decode_shard and batch the samples")
