"""The dataset's manifest: every shard's content hash, size and sample count, and a version that names them all.

A manifest is plain JSON, so a run can record it beside its checkpoints:

    {"version": "<sha256 of the shards table>",
     "shards": {"shard-00000.bin": {"sha256": "...", "bytes": 17800, "samples": 67}, ...}}
"""
import hashlib  # noqa: F401 - you will need these
import json  # noqa: F401

from infracourse.kit.datapipe import ShardChanged, decode_shard  # noqa: F401


def shard_hash(name: str, data: bytes) -> str:
    """What identifies a shard's content."""
    raise NotImplementedError("TODO (manifest.py): shard_hash - the sha256 of the shard's bytes, as hex")


def dataset_version(shards: dict) -> str:
    """One hash for the whole shards table: the same files give the same version on any machine."""
    raise NotImplementedError("TODO (manifest.py): dataset_version - hash the shards table in one canonical form")


def build_manifest(storage) -> dict:
    """Read every shard of storage.names() once and describe it: {"version": ..., "shards": {...}}."""
    raise NotImplementedError("TODO (manifest.py): build_manifest - read each shard (storage.read), record its "
                              "sha256, bytes and samples (decode_shard), then the version")


def verify(manifest: dict, name: str, data: bytes) -> bytes:
    """`data` if it is the shard the manifest describes; raise ShardChanged(name) otherwise."""
    raise NotImplementedError("TODO (manifest.py): verify - compare the bytes' hash with the manifest's entry")


def changed_shards(storage, manifest: dict) -> list[str]:
    """The names of the shards whose content no longer matches the manifest (or that appeared or vanished)."""
    raise NotImplementedError("TODO (manifest.py): changed_shards")
