"""The dataset's manifest: every shard's content hash, size and sample count, and a version that names them all.

A manifest is plain JSON, so a run can record it beside its checkpoints:

    {"version": "<sha256 of the shards table>",
     "shards": {"shard-00000.bin": {"sha256": "...", "bytes": 17800, "samples": 67}, ...}}
"""
import hashlib
import json

from infracourse.kit.datapipe import ShardChanged, decode_shard


def shard_hash(name: str, data: bytes) -> str:
    """What identifies a shard's content: the hash of its bytes (its name and size say nothing about them)."""
    return hashlib.sha256(data).hexdigest()


def dataset_version(shards: dict) -> str:
    """The hash of the shards table in one canonical form (sorted keys, no spaces): the same files give the
    same version on any machine, in any folder, whatever order they were written in."""
    canonical = json.dumps(shards, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def build_manifest(storage) -> dict:
    """Read every shard once and describe it."""
    shards = {}
    for name in storage.names():
        data = storage.read(name)
        ids, _ = decode_shard(data)
        shards[name] = {"sha256": shard_hash(name, data), "bytes": len(data), "samples": len(ids)}
    return {"version": dataset_version(shards), "shards": shards}


def verify(manifest: dict, name: str, data: bytes) -> bytes:
    """`data` if it is the shard the manifest describes; ShardChanged otherwise."""
    if shard_hash(name, data) != manifest["shards"][name]["sha256"]:
        raise ShardChanged(name)
    return data


def changed_shards(storage, manifest: dict) -> list[str]:
    """The shards whose content no longer matches the manifest (or that appeared or vanished)."""
    names = set(storage.names())
    changed = names.symmetric_difference(manifest["shards"])
    for name in names & set(manifest["shards"]):
        if shard_hash(name, storage.read(name)) != manifest["shards"][name]["sha256"]:
            changed.add(name)
    return sorted(changed)
