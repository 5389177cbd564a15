"""A local cache in front of slow storage: each shard fetched once, then read from local disk."""


class LocalCache:
    def __init__(self, storage, manifest: dict, folder):
        self.storage, self.manifest, self.folder = storage, manifest, folder

    def read(self, name: str) -> bytes:
        raise NotImplementedError("TODO (cache.py): read - the local copy if there is one, else fetch and keep it")
