"""Week 19's fixed pieces: a seeded sharded dataset, slow storage in front of it, and the driver the judge runs.

The dataset is generated from a seed (nothing is downloaded): `shards` files, each holding a few dozen samples,
every sample an int64 id (unique, drawn from the seed, not its position) and `payload_bytes` of seeded bytes.
One shard file, little-endian:

    b"IC19"  uint32 count  uint32 payload_bytes  int64 ids[count]  uint8 payloads[count, payload_bytes]

Storage is slow on purpose, like an object store or a network file system: it is a small server (a thread of
whoever starts it) on a Unix socket that sleeps `latency_s` before answering each read, and counts the reads.
The learner's code sees a `Storage` client (names(), read(name)); in a grade the server runs in the judge, so
its clock, its latency and its count of reads are the judge's, and the files behind it are not reachable
otherwise. A sleep is not slowed by a loaded CPU, so the latency holds on a busy machine.

The driver (`python -m infracourse.kit.datapipe TASK.json`, started by the judge in the sandbox) imports the
learner's pipeline, runs one task on it and writes one line per result, prefixed with `@@datapipe `, to its
stdout; the learner's own prints go to stderr. A line is evidence the judge checks, never a verdict.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"IC19"
HEADER = struct.Struct("<4sII")
MARK = "@@datapipe "
NOT_WRITTEN = 2


class ShardChanged(Exception):
    """Raised by a loader that read a shard whose bytes do not hash to the manifest's entry. `.name` is the shard."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"shard {name} does not match its hash in the manifest")


# --- the dataset -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DatasetSpec:
    """A seeded dataset: `shards` files of `min_samples`..`max_samples` samples of `payload_bytes` each."""

    seed: int = 19
    shards: int = 12
    min_samples: int = 48
    max_samples: int = 80
    payload_bytes: int = 256

    def shard_name(self, k: int) -> str:
        return f"shard-{k:05d}.bin"

    def layout(self) -> dict[str, list[int]]:
        """{shard name: its sample ids, in file order}, from the seed alone."""
        rng = np.random.default_rng(self.seed)
        counts = rng.integers(self.min_samples, self.max_samples + 1, size=self.shards)
        ids = rng.choice(10 ** 9, size=int(counts.sum()), replace=False)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        return {self.shard_name(k): ids[bounds[k]:bounds[k + 1]].tolist() for k in range(self.shards)}

    def reference_ids(self) -> list[int]:
        """Every sample id of the dataset, shard by shard in file order: the truth a loader is checked against."""
        return [i for ids in self.layout().values() for i in ids]


LAB = DatasetSpec()  # the handout's dataset: experiment.py and the report use it
# The handout's storage setup and training step, which the judge's timed epochs use too:
LATENCY_S = 0.06   # each read of a shard from storage sleeps this long first
COMPUTE_S = 0.02   # a training step: the loop sleeps this long per batch (the CPU stays free for a prefetcher)
BATCH_SIZE = 16
PREFETCH = 8       # batches a prefetcher may hold
STREAM = DatasetSpec(seed=1919, shards=32, min_samples=48, max_samples=48, payload_bytes=64 * 1024)  # 96 MiB


def payload(spec: DatasetSpec, sample_id: int) -> np.ndarray:
    """The bytes of one sample, (payload_bytes,) uint8, from the seed and the id."""
    return np.random.default_rng([spec.seed, int(sample_id)]).integers(0, 256, spec.payload_bytes, dtype=np.uint8)


def encode_shard(spec: DatasetSpec, ids: list[int]) -> bytes:
    payloads = np.stack([payload(spec, i) for i in ids])
    return HEADER.pack(MAGIC, len(ids), spec.payload_bytes) + np.asarray(ids, "<i8").tobytes() + payloads.tobytes()


def decode_shard(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(ids (count,) int64, payloads (count, payload_bytes) uint8): read-only views of `data`, no copy."""
    magic, count, size = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a week-19 shard (bad magic)")
    ids = np.frombuffer(data, "<i8", count, HEADER.size)
    payloads = np.frombuffer(data, np.uint8, count * size, HEADER.size + 8 * count).reshape(count, size)
    return ids, payloads


def write_dataset(spec: DatasetSpec, root: Path, *, reverse: bool = False) -> Path:
    """Write the dataset's shard files into `root` (in reverse order with `reverse`: another copy's files get
    other creation times and directory order, as a copy on someone else's machine would)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    items = list(spec.layout().items())
    for name, ids in reversed(items) if reverse else items:
        (root / name).write_bytes(encode_shard(spec, ids))
    return root


def corrupt_shard(path: Path, seed: int) -> int:
    """Flip bits of one payload byte of a shard file in place: same size, same modification time. Returns
    the byte's offset."""
    path = Path(path)
    stat = path.stat()
    data = bytearray(path.read_bytes())
    _, count, _ = HEADER.unpack_from(data)
    start = HEADER.size + 8 * count
    offset = start + np.random.default_rng(seed).integers(0, len(data) - start)
    data[offset] ^= 0xA5
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return int(offset)


def rewrite_shard(spec: DatasetSpec, path: Path, seed: int) -> list[int]:
    """Replace a shard file's samples with as many new ones (ids drawn from `seed`, none of the dataset's, their
    payloads the seed's): same name, same size, same modification time, other bytes; data updated behind a
    cache. Returns the new ids, in file order."""
    path = Path(path)
    stat = path.stat()
    _, count, _ = HEADER.unpack_from(path.read_bytes())
    taken, rng, ids = set(spec.reference_ids()), np.random.default_rng([spec.seed, seed, 29]), []
    while len(ids) < count:
        i = int(rng.integers(10 ** 9, 2 * 10 ** 9))  # above every id the seed draws for a dataset
        if i not in taken:
            taken.add(i)
            ids.append(i)
    path.write_bytes(encode_shard(spec, ids))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return ids


def ids_digest(ids) -> str:
    """sha256 of a sequence of sample ids (as int64): an epoch's order in 64 characters."""
    return hashlib.sha256(np.asarray(list(ids), "<i8").tobytes()).hexdigest()


# --- slow storage ------------------------------------------------------------------------------------------

def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            raise ConnectionError("storage closed the connection early")
        got += k
    return bytes(buf)


class StorageServer:
    """Serves the shard files of `root` on a Unix socket, sleeping `latency_s` before each read; `reads`
    counts the reads of each shard. A request is one line (`LIST` or `READ name`); the answer is an 8-byte
    length, then the bytes (JSON for LIST). Each connection is served in its own thread, as parallel reads are."""

    def __init__(self, root: Path, socket_path: Path, latency_s: float = 0.0):
        self.root, self.socket_path, self.latency_s = Path(root), Path(socket_path), latency_s
        self.reads: Counter = Counter()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def __enter__(self) -> "StorageServer":
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.socket_path))
        self.socket_path.chmod(0o777)
        self._sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def take_reads(self) -> Counter:
        with self._lock:
            reads, self.reads = self.reads, Counter()
        return reads

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            line = conn.makefile("rb").readline(4096).decode().strip()
            if line == "LIST":
                body = json.dumps(sorted(p.name for p in self.root.iterdir() if p.is_file())).encode()
            elif line.startswith("READ ") and "/" not in line and (self.root / line[5:]).is_file():
                time.sleep(self.latency_s)  # the storage's latency, on the judge's clock
                body = (self.root / line[5:]).read_bytes()
                with self._lock:
                    self.reads[line[5:]] += 1
            else:
                body = b""
            conn.sendall(struct.pack("<Q", len(body)) + body)


class Storage:
    """The client the learner's code reads shards through. Thread-safe: one connection per request."""

    def __init__(self, socket_path: str | Path):
        self.socket_path = str(socket_path)

    def _ask(self, line: str) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.socket_path)
            conn.sendall(line.encode() + b"\n")
            (n,) = struct.unpack("<Q", _recv_exact(conn, 8))
            return _recv_exact(conn, n)

    def names(self) -> list[str]:
        """The shard files' names, sorted."""
        return json.loads(self._ask("LIST"))

    def read(self, name: str) -> bytes:
        """One shard file's bytes, after the storage's latency."""
        data = self._ask(f"READ {name}")
        if not data:
            raise FileNotFoundError(name)
        return data


@contextlib.contextmanager
def slow_storage(root: Path, latency_s: float):
    """A StorageServer for `root` in a thread of this process, and a Storage client of it (for experiment.py)."""
    folder = tempfile.mkdtemp(prefix="slow-storage-")
    with StorageServer(root, Path(folder) / "storage.sock", latency_s) as server:
        storage = Storage(server.socket_path)
        storage.server = server
        yield storage
    os.rmdir(folder)


def reference_batches(storage: Storage, names: list[str], batch_size: int):
    """The course's synchronous loader: each shard read when its first sample is needed, batches in file order
    (the baseline the judge times a learner's prefetching against)."""
    ids, payloads = [], []
    for name in names:
        shard_ids, shard_payloads = decode_shard(storage.read(name))
        for i in range(len(shard_ids)):
            ids.append(shard_ids[i]), payloads.append(shard_payloads[i])
            if len(ids) == batch_size:
                yield np.array(ids), np.stack(payloads)
                ids, payloads = [], []
    if ids:
        yield np.array(ids), np.stack(payloads)


# --- the driver: runs the learner's pipeline in a confined process of its own ------------------------------

@dataclass
class DriverRun:
    """What one driver process printed: its result lines, each with the judge's clock at arrival."""

    lines: list[tuple[float, dict]]
    returncode: int | None  # None: killed at the time limit
    stderr: str

    def results(self, key: str) -> list[dict]:
        return [line for _, line in self.lines if key in line]

    def at(self, key: str) -> float | None:
        return next((t for t, line in self.lines if key in line), None)


def run_driver(task: dict, *, snapshot: Path, scratch: Path, timeout_s: float = 60, on_line=None) -> DriverRun:
    """Run one task (see `_TASKS`) on the learner's pipeline, confined (infracourse.launch); its lines are
    stamped with time.perf_counter() here, as they arrive, and each is given to `on_line` then (the judge acts
    between the driver's steps: the epochs task waits for it)."""
    import subprocess

    from infracourse import launch  # why: the judge's half; the driver half runs confined and starts nothing
    from infracourse.launch import output

    scratch.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkstemp(dir=scratch, prefix="task-", suffix=".json")[1])
    path.write_text(json.dumps({**task, "learner": str(Path(snapshot).resolve())}))
    # one malloc arena per thread would reserve address space, not memory: keep two (see the stream task)
    env = launch.environment(scratch, MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    # stderr beside the scratch (the driver cannot see or replace it), both streams cut past output.OUTPUT_LIMIT
    proc = launch.start([sys.executable, "-s", "-m", "infracourse.kit.datapipe", str(path)], scratch=scratch,
                        snapshot=snapshot, env=env, log=scratch.parent / f"{scratch.name}-{path.stem}.stderr.log",
                        stdout=subprocess.PIPE, text=True)
    killed = threading.Event()
    timer = threading.Timer(timeout_s, lambda: (killed.set(), proc.kill_tree()))
    timer.start()
    lines = []
    cut = False
    try:
        for text in output.lines(proc):
            if text.startswith(MARK):
                with contextlib.suppress(ValueError):
                    line = json.loads(text[len(MARK):])
                    if isinstance(line, dict):
                        lines.append((time.perf_counter(), line))
                        if on_line is not None:
                            on_line(line)
    except output.OutputCut:
        cut = True  # its session is killed
    proc.wait()  # the timer still runs: a driver that closed its stdout and went on is killed at the limit
    timer.cancel()
    stderr = proc.tail() + (f"\n{output.CUT_NOTE}" if cut or proc.cut else "")
    return DriverRun(lines, None if killed.is_set() else proc.returncode, stderr)


_results = sys.stdout  # main() points it at a private copy of stdout, away from the learner's prints


def _emit(**line) -> None:
    print(MARK + json.dumps(line), file=_results, flush=True)


def _check_batch(batch, spec: DatasetSpec, every: int) -> list[int]:
    """The ids of one batch, after checking its shape and (every `every`-th sample; none for 0) its payloads."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(f"a batch must be (ids, payloads), got {type(batch).__name__}")
    ids, payloads = np.asarray(batch[0]), np.asarray(batch[1])
    if ids.ndim != 1 or payloads.shape != (len(ids), spec.payload_bytes) or payloads.dtype != np.uint8:
        raise TypeError(f"a batch must be ids (B,) and payloads (B, {spec.payload_bytes}) uint8; got ids "
                        f"{ids.shape}, payloads {payloads.shape} {payloads.dtype}")
    for row in range(0, len(ids), every) if every else ():
        if not np.array_equal(payloads[row], payload(spec, ids[row])):
            raise ValueError(f"the payload given with sample id {int(ids[row])} is not that sample's bytes")
    return [int(i) for i in ids]


def _pipe(task: dict, cfg: dict):
    import pipeline  # the learner's

    return pipeline.make_pipeline(Storage(task["socket"]), task["manifest"], **cfg)


def _epoch(pipe, spec, every=1, on_batch=None) -> list[list[int]]:
    batches = []
    for batch in pipe:
        batches.append(_check_batch(batch, spec, every))
        if on_batch is not None:
            on_batch(len(batches))
    return batches


def _task_manifest(task, spec):
    import manifest  # the learner's

    storage = Storage(task["socket"])
    _emit(manifest=json.loads(json.dumps(manifest.build_manifest(storage))))
    if task.get("old") is not None:
        _emit(changed=sorted(manifest.changed_shards(storage, task["old"])))


def _task_ids(task, spec):
    every = task.get("payload_every", 1)  # 0 over a changed dataset: its bytes are not the seed's on purpose
    for k, cfg in enumerate(task["streams"]):
        seen: list[int] = []
        try:
            for batch in _pipe(task, cfg):
                seen += _check_batch(batch, spec, every)
        except ShardChanged as exc:
            _emit(stream=k, shard_changed=str(exc.name), ids=seen)
            continue
        _emit(stream=k, ids=seen)


def _task_checkpoint(task, spec):
    for k, case in enumerate(task["cases"]):
        pipe, state = _pipe(task, case["cfg"]), {}

        def take(done, pipe=pipe, at=case["at"]):
            if done == at:  # the loop has consumed `at` batches: the position a checkpoint saves
                time.sleep(task["step_s"])  # a training step first: a prefetcher fills its queue meanwhile
                state["state"] = json.loads(json.dumps(pipe.state_dict()))

        batches = _epoch(pipe, spec, on_batch=take)
        _emit(case=k, batches=batches, state=state.get("state"))


def _task_resume(task, spec):
    for k, case in enumerate(task["cases"]):
        pipe = _pipe(task, case["cfg"])
        pipe.load_state_dict(case["state"])
        _emit(case=k, batches=_epoch(pipe, spec))


def _task_epochs(task, spec):
    """Epochs of one configuration in this one process, each a new make_pipeline, every payload checked. After
    each epoch's line the driver waits (at most `wait_s`) for the judge's file `go-<k>`, written once the judge
    has changed the data behind the storage; a `build` in it asks for a new manifest from the learner's
    build_manifest, through the second storage `manifest_socket` (so the pipeline's reads stay apart)."""
    import manifest as learner_manifest

    current = task["manifest"]
    for k, epoch in enumerate(task["epochs"]):
        if k:
            go, deadline = Path(f"{task['go']}-{k}"), time.monotonic() + task.get("wait_s", 30)
            while not go.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the judge's signal {go.name} never came")
                time.sleep(0.005)
            if json.loads(go.read_text()).get("build"):
                current = json.loads(json.dumps(learner_manifest.build_manifest(Storage(task["manifest_socket"]))))
                _emit(manifest=current, before=epoch)
        ids, wait = [], 0.0
        try:
            for batch, waited in _waited_batches(_pipe(task | {"manifest": current}, dict(task["cfg"], epoch=epoch))):
                wait += waited
                ids += _check_batch(batch, spec, 1)
        except ShardChanged as exc:
            _emit(epoch=epoch, shard_changed=str(exc.name), ids=ids, wait_s=wait)
            continue
        _emit(epoch=epoch, ids=ids, wait_s=wait)


def _task_timed(task, spec):
    """One epoch, each batch followed by `compute_s` of sleep (a training step that leaves the CPU free)."""
    if task.get("reference"):
        pipe = reference_batches(Storage(task["socket"]), task["names"], task["cfg"]["batch_size"])
    else:
        pipe = _pipe(task, task["cfg"])
    ids, wait = [], 0.0
    _emit(start=True)
    for batch, waited in _waited_batches(pipe):
        wait += waited
        ids += _check_batch(batch, spec, 8)
        time.sleep(task["compute_s"])
    _emit(end=True, wait_s=wait, ids=ids)


def _waited_batches(pipe):
    """Each batch of `pipe` with the seconds the consumer waited for it (the pipeline's exceptions pass through)."""
    it = iter(pipe)
    while True:
        started = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        yield batch, time.perf_counter() - started


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _task_stream(task, spec):
    """One epoch under a memory cap: RLIMIT_DATA at this process's data size now (interpreter, NumPy, the
    learner's imports) plus `budget_bytes`. A pause after the first batch, and a short step after each other
    one, let a prefetcher run as far ahead as it is allowed to."""
    import resource

    import manifest  # noqa: F401 - the learner's imports count in the baseline, not in the budget
    import pipeline  # noqa: F401

    reserve = bytearray(1 << 16)  # room to report a MemoryError
    base = _vm("VmData")
    resource.setrlimit(resource.RLIMIT_DATA, (base + task["budget_bytes"], resource.RLIM_INFINITY))
    count, digest = 0, hashlib.sha256()
    try:
        for batch in _pipe(task, task["cfg"]):
            ids = _check_batch(batch, spec, 16)
            count += len(ids)
            digest.update(np.asarray(ids, "<i8").tobytes())
            time.sleep(task["pause_s"] if count == len(ids) else task["step_s"])
    except MemoryError:
        del reserve
        _emit(memory_error=True, samples=count, base_bytes=base)
        return
    _emit(samples=count, digest=digest.hexdigest(), base_bytes=base, peak_rss_bytes=_vm("VmHWM"))


_TASKS = {"manifest": _task_manifest, "ids": _task_ids, "checkpoint": _task_checkpoint, "resume": _task_resume,
          "timed": _task_timed, "stream": _task_stream, "epochs": _task_epochs}


def main(path: str) -> int:
    global _results
    # results go to a duplicate of stdout; the learner's prints (fd 1) go to stderr with its errors
    _results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    task = json.loads(Path(path).read_text())
    sys.path.insert(0, task["learner"])
    spec = DatasetSpec(**task["spec"])
    try:
        _TASKS[task["task"]](task, spec)
    except NotImplementedError as exc:
        print(f"NotImplementedError: {exc}", file=sys.stderr)
        return NOT_WRITTEN
    return 0


if __name__ == "__main__":
    # run as the module itself, not as __main__: ShardChanged must be the class the learner's code imports
    from infracourse.kit.datapipe import main as _main  # why: the module itself, not __main__ (see above)

    sys.exit(_main(sys.argv[1]))
