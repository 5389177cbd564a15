"""Which shards a stream reads: one stream per (rank, dataloader worker), no shard in two streams."""


def assign_shards(names: list[str], *, rank: int, world_size: int, worker: int, num_workers: int, seed: int,
                  epoch: int) -> list[str]:
    """This stream's shards for this epoch, in the order it reads them. Together the world_size * num_workers
    streams must cover every shard exactly once, and every stream must agree on the split without talking to
    the others."""
    raise NotImplementedError("TODO (sharding.py): assign_shards - split the shards between (rank, worker) streams")
