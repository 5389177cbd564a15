"""Which shards a stream reads: one stream per (rank, dataloader worker), no shard in two streams."""
import random


def assign_shards(names: list[str], *, rank: int, world_size: int, worker: int, num_workers: int, seed: int,
                  epoch: int) -> list[str]:
    """This stream's shards for this epoch, in the order it reads them.

    Every stream shuffles the same sorted list with the same (seed, epoch), so all of them agree on the order
    without talking to each other; stream s of the world_size * num_workers streams then takes every
    (world_size * num_workers)-th shard starting at s. Together the streams cover each shard exactly once.
    """
    order = sorted(names)
    random.Random(f"{seed}/{epoch}").shuffle(order)
    stream = rank * num_workers + worker
    return order[stream::world_size * num_workers]
