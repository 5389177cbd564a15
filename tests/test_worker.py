"""The judge's side of the worker channel (grading.remote) against real sandboxed workers.

A worker that dies, hangs, floods its output or breaks the protocol must make the call raise WorkerFailed
saying what happened, never crash or hang the judge; values must cross the channel intact (the codec).
Each fault test starts its own small learner folder and worker; the codec tests share one.
"""
from __future__ import annotations

import itertools
import json
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from infracourse import sandbox
from infracourse.grading.remote import LearnerRaised, RemoteObject, WorkerClient, WorkerFailed

OUT_FD = "import sys\n\ndef out_fd():\n    return int(sys.argv[sys.argv.index('--out') + 1])\n\n"


def frame(header: dict, blobs: list[bytes] = ()) -> bytes:
    """A message in grading.protocol's framing, as a hostile worker would write it by hand."""
    body = json.dumps(header).encode()
    return struct.pack("<II", len(body), len(blobs)) + struct.pack(f"<{len(blobs)}Q", *map(len, blobs)) + body + \
        b"".join(blobs)


@pytest.fixture
def make_worker(tmp_path):
    started = []

    def _make(source: str, name: str = "mod") -> WorkerClient:
        folder = tmp_path / f"learner{len(started)}"
        folder.mkdir()
        (folder / f"{name}.py").write_text(source)
        worker = WorkerClient(folder, gpu=False)
        started.append(worker)
        return worker

    yield _make
    for worker in started:
        worker.close()


def test_sigkill_mid_call_is_worker_failed_naming_the_signal(make_worker):
    worker = make_worker("import os, signal\n\ndef f():\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(WorkerFailed, match="SIGKILL"):
        worker.module("mod").f()


def test_hard_exit_says_so_and_the_module_is_imported_again_in_a_fresh_worker(make_worker):
    worker = make_worker("import os\n\ndef die():\n    print('last words')\n    os._exit(3)\n\n\n"
                         "def ok():\n    return 5\n\n\nclass Box:\n    pass\n\n\ndef box():\n    return Box()\n")
    mod = worker.module("mod")
    ok, box = mod.ok, mod.box()  # a function reached by name, and an object a call returned
    with pytest.raises(WorkerFailed, match="exited with code 3") as failed:
        mod.die()
    assert "last words" in str(failed.value)  # its last output is part of the message
    first = worker.generation
    assert ok() == 5 and mod.ok() == 5  # found again by name in the fresh worker
    assert worker.generation == first + 1
    with pytest.raises(WorkerFailed, match="since stopped"):
        box.anything  # an object of the dead worker names nothing in the new one


def test_learner_exception_is_learner_raised_with_its_line(make_worker):
    worker = make_worker("def f(x):\n    raise ValueError(f'bad {x}')\n")
    with pytest.raises(LearnerRaised) as raised:
        worker.module("mod").f(3)
    assert raised.value.type_name == "ValueError" and "bad 3" in raised.value.message
    assert raised.value.where.startswith("mod.py:2")


@pytest.mark.skipif(not sandbox.status().available, reason="only the sandbox's PID namespace catches daemons")
def test_close_stops_a_hung_call_and_every_process_it_started(make_worker):
    marker = f"{time.time_ns() % 10**9}.25"
    worker = make_worker(
        "import os, subprocess, time\n\n"
        "def hang():\n"
        f"    subprocess.Popen(['sleep', '{marker}'])\n"
        "    if os.fork() == 0:\n"  # a double-forked daemon in its own session
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        f"            os.execvp('sleep', ['sleep', '{marker}'])\n"
        "        os._exit(0)\n"
        "    time.sleep(1000)\n")
    mod = worker.module("mod")
    failure = []

    def call():
        try:
            mod.hang()
        except WorkerFailed as exc:
            failure.append(str(exc))

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 60
    while len(_processes_with(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_processes_with(marker)) == 2, "the learner's children never started"
    worker.close()
    caller.join(timeout=30)
    assert not caller.is_alive(), "a call into a closed worker still waits"
    assert failure, "the hung call returned instead of failing"
    deadline = time.monotonic() + 10
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(marker), "a process the learner started survived close()"


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_flooding_stdout_and_stderr_does_not_block_and_goes_to_the_log(make_worker):
    worker = make_worker("import sys\n\ndef flood():\n    line = 'x' * 1023 + '\\n'\n"
                         "    for _ in range(8 * 1024):\n        sys.stdout.write(line)\n        sys.stderr.write(line)\n"
                         "    sys.stdout.flush()\n    print('done flooding')\n    return 7\n")
    assert worker.module("mod").flood() == 7
    # the judge's copying thread may still be a chunk behind the answer that came on the protocol pipe
    deadline = time.monotonic() + 30
    while "done flooding" not in worker.output_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.log_path.stat().st_size >= 16 * 2**20  # well past a pipe's buffer, under output.OUTPUT_LIMIT
    assert "done flooding" in worker.output_tail()
    worker.close()
    assert not worker.log_path.exists()  # read into the messages while it ran, not left behind by every grade


@pytest.mark.parametrize("written, expected", [
    (b"garbage!" * 4, "broke the grading protocol: a message announced"),
    (struct.pack("<II", 2, 1) + struct.pack("<Q", 10 * 2**30) + b"{}", "the limit is"),
    (frame({"id": 999, "ok": True, "value": 1}), "an answer to request 999"),
    (frame([1, 2]), "not a JSON object"),
])
def test_malformed_or_oversized_messages_are_worker_failed(make_worker, written, expected):
    worker = make_worker(OUT_FD + f"import os\n\ndef f():\n    os.write(out_fd(), {written!r})\n    return 1\n")
    mod = worker.module("mod")
    with pytest.raises(WorkerFailed, match=expected):
        mod.f()
    assert worker.proc is None  # a worker that broke the protocol is not trusted further


@pytest.mark.parametrize("value, expected", [
    ({"tensor": {"storage": 0, "dtype": "float32", "shape": [1000], "stride": [1], "offset": 0}},
     "reaches past its storage"),
    ({"tensor": {"storage": 0, "dtype": "float32", "shape": [-1], "stride": [1], "offset": 0}}, "malformed"),
    ({"pickle": "gASVAAAAAAAAAAA="}, "unexpected value tag 'pickle'"),
    ({"device": "not-a-device"}, "malformed answer"),
    ({"dtype": "object"}, "unknown dtype"),
])
def test_answers_the_decoder_cannot_rebuild_are_worker_failed(make_worker, value, expected):
    message = {"id": 100, "ok": True, "value": value, "storages": [{"device": "cpu", "nbytes": 4, "blob": 0}]}
    worker = make_worker(OUT_FD + f"import os\n\ndef f():\n    os.write(out_fd(), {frame(message, [b'abcd'])!r})\n")
    f = worker.module("mod").f
    worker.ids = itertools.count(100)  # the forged answer carries the id the call will have
    with pytest.raises(WorkerFailed, match=expected):
        f()


# ---------------------------------------------------------------------------------------------- codec
CODEC = """
import threading
import torch


def echo(*args, **kwargs):
    return args, kwargs


def same(x):
    return x


def rebuilt(x):
    # the same view over a copy of x's whole storage: travels back as a new storage, not as x's
    out = torch.empty(0, dtype=x.dtype)
    return out.set_(x.untyped_storage().clone(), x.storage_offset(), x.shape, x.stride())


def views(x):
    return x[1:], x[:, 1:], x.t()


def apply(fn, *args):
    return fn(*args)


def in_threads(fn, n):
    out = [None] * n

    def run(i):
        out[i] = fn(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def square(x):
    return x * x


def mixed(x, w):
    return (x @ w).tanh().sum(dim=-1), x.exp()


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self, by=1):
        self.n += by
        return self.n


def counter():
    return Counter()


def count_of(c):
    return c.n
"""


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    folder = tmp_path_factory.mktemp("codec")
    (folder / "codec.py").write_text(CODEC)
    worker = WorkerClient(folder, gpu=False)
    yield worker.module("codec")
    worker.close()


def _same_tensor(a, b):
    assert type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
    assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
    assert bytes(a.untyped_storage()) == bytes(b.untyped_storage())  # fences outside the view included


@pytest.mark.parametrize("make", [
    lambda: torch.randn(5, 7),
    lambda: torch.randn(5, 7).t(),
    lambda: torch.randn(6, 8)[1:, 2:5],
    lambda: torch.randn(8, dtype=torch.float64)[::3],
    lambda: torch.randn(3, 3).to(torch.bfloat16),
    lambda: torch.rand(4) > 0.5,
    lambda: torch.empty(0, 3),
    lambda: torch.tensor(3.5),
    lambda: torch.arange(10, dtype=torch.int64).reshape(2, 5)[:, ::2],
    lambda: torch.tensor([float("nan"), float("inf"), -0.0]),
])
def test_tensors_cross_intact(codec, make):
    x = make()
    back = codec.rebuilt(x)
    _same_tensor(x, back)
    assert x.numel() == 0 or back.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_shared_storage_is_shared_after_the_trip(codec):
    base = torch.randn(6, 6)
    (a, b, c), _ = codec.echo(base[1:], base[:, 2:], base.t())
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
    a[0, 0] = 123.0
    assert c[0, 1] == 123.0  # still views of one storage


def test_a_returned_input_is_the_judges_own_storage(codec):
    x = torch.randn(4, 5)
    assert codec.same(x).untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    for got, want in zip(codec.views(x), (x[1:], x[:, 1:], x.t())):
        _same_tensor(want, got)
        assert got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_plain_values_numpy_and_nesting_cross_intact(codec):
    value = {"a": (1, 2.5, None, True, "s", [3, (4, {"b": 2**70})]), "arr": np.arange(6, dtype=np.int32).reshape(2, 3),
             "f": np.float32(1.5), "dtype": torch.float16, "size": torch.Size([2, 3])}
    (back,), kwargs = codec.echo(value, k=(1,))
    assert kwargs == {"k": (1,)}
    assert back["a"] == value["a"] and isinstance(back["a"][5][1], tuple)
    np.testing.assert_array_equal(back["arr"], value["arr"])
    assert back["arr"].dtype == np.int32 and back["f"] == 1.5
    assert back["dtype"] is torch.float16 and tuple(back["size"]) == (2, 3)


def test_callbacks_run_in_the_judge_and_overlap_across_learner_threads(codec):
    seen = []
    assert codec.apply(lambda a, b: seen.append(threading.get_ident()) or a + b, 2, 3) == 5
    assert len(seen) == 1 and seen[0] != threading.get_ident()  # ran in the judge, on a callback thread
    barrier = threading.Barrier(4, timeout=20)  # passes only if all four calls are in flight at once

    def meet(i):
        barrier.wait()
        return i * i

    assert codec.in_threads(meet, 4) == [0, 1, 4, 9]


def test_a_failing_callback_raises_in_the_learner_code(codec):
    def fails(_):
        raise KeyError("judge side")

    with pytest.raises(LearnerRaised, match="the grader's function raised: KeyError"):
        codec.apply(fails, 1)


def test_handles_stay_in_the_worker_and_go_back_as_themselves(codec):
    c = codec.counter()
    assert isinstance(c, RemoteObject) and c.type_name == "Counter"
    assert c.bump() == 1 and c.bump(by=4) == 5
    assert codec.count_of(c) == 5  # passed back as the worker's own object, not a callback


def test_autograd_bridges_backward_into_the_worker(codec):
    x = torch.randn(3, 4, requires_grad=True)
    y = codec.square(x)
    assert y.requires_grad
    y.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_gradcheck_through_the_worker(codec):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: codec.mixed(a, b), (x, w))


def test_every_op_has_one_handler_and_an_unknown_op_is_refused(tmp_path):
    """The judge's requests are protocol.Op, served by the worker's handler table: one handler per op, each
    answering with a protocol.Reply; an op outside the enum is refused at both ends."""
    from infracourse.grading.protocol import Op, ProtocolError, Reply
    from infracourse.grading.remote import WorkerClient
    from infracourse.grading.worker import WorkerLoop

    assert set(WorkerLoop.HANDLERS) == set(Op)
    loop = WorkerLoop(-1, -1, Path("."))
    assert loop.handle({"op": "ping"}, loop.decoder({}, [])) == Reply()
    with pytest.raises(ProtocolError, match="unknown op 'exec'"):
        loop.handle({"op": "exec"}, loop.decoder({}, []))
    client = WorkerClient(tmp_path, gpu=False)
    with pytest.raises(ValueError):
        client.request("exec")  # refused before any worker starts
    assert client.proc is None
    client.close()
