"""Background prefetch: a thread runs the loader up to `depth` batches ahead of the training loop."""


class Prefetcher:
    def __init__(self, loader, depth: int):
        self.loader, self.depth = loader, depth

    def state_dict(self) -> dict:
        """The position of the last batch the training loop received (the loader itself is ahead)."""
        raise NotImplementedError("TODO (prefetch.py): state_dict")

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError("TODO (prefetch.py): load_state_dict")

    def __iter__(self):
        raise NotImplementedError("TODO (prefetch.py): __iter__ - a thread fills a bounded queue; yield from it")
