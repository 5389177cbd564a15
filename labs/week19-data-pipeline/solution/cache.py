"""A local cache in front of slow storage: each shard fetched once, then read from local disk.

Files are named by their content hash from the manifest, so a changed shard is a different file and a stale
copy is never served; a fill is written to a temporary name and renamed, so two workers filling the same shard
at once, or a process killed mid-write, never leave half a file under a real name.
"""
import os
from pathlib import Path

from manifest import verify


class LocalCache:
    def __init__(self, storage, manifest: dict, folder):
        self.storage, self.manifest = storage, manifest
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def read(self, name: str) -> bytes:
        path = self.folder / f"{self.manifest['shards'][name]['sha256']}.bin"
        if path.exists():
            return path.read_bytes()
        data = verify(self.manifest, name, self.storage.read(name))  # never cache bytes that do not match
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return data
