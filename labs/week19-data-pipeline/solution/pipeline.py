"""The data pipeline of one (rank, dataloader worker): storage -> cache -> this stream's shards -> prefetch."""
from cache import LocalCache
from loader import ShardedLoader
from prefetch import Prefetcher
from sharding import assign_shards


def make_pipeline(storage, manifest: dict, *, batch_size: int, seed: int, epoch: int = 0, rank: int = 0,
                  world_size: int = 1, worker: int = 0, num_workers: int = 1, prefetch: int = 0,
                  cache_dir=None):
    """An iterable of (ids (B,) int64, payloads (B, P) uint8) batches with state_dict() / load_state_dict()."""
    read = LocalCache(storage, manifest, cache_dir).read if cache_dir else storage.read
    shards = assign_shards(list(manifest["shards"]), rank=rank, world_size=world_size, worker=worker,
                           num_workers=num_workers, seed=seed, epoch=epoch)
    loader = ShardedLoader(read, manifest, shards, batch_size=batch_size, seed=seed, epoch=epoch)
    return Prefetcher(loader, prefetch) if prefetch else loader
