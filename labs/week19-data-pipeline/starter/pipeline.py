"""The data pipeline of one (rank, dataloader worker): storage -> cache -> this stream's shards -> prefetch."""


def make_pipeline(storage, manifest: dict, *, batch_size: int, seed: int, epoch: int = 0, rank: int = 0,
                  world_size: int = 1, worker: int = 0, num_workers: int = 1, prefetch: int = 0,
                  cache_dir=None):
    """An iterable of (ids (B,) int64, payloads (B, P) uint8) batches with state_dict() / load_state_dict()."""
    raise NotImplementedError("TODO (pipeline.py): make_pipeline - compose LocalCache (when cache_dir), "
                              "assign_shards, ShardedLoader and Prefetcher (when prefetch > 0)")
