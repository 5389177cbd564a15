"""The judge's reading of the learner's sources (grading.provenance): every forbidden construct is caught,
no honest file of the course trips it, a graded function must reach its own @triton.jit launch, and a week 7
file that forges the worker's records with a torch add fails kernel-did-work however the records read."""
from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from infracourse.grading.forbidden import scan_module
from infracourse.grading.kernel_reach import kernel_findings
from infracourse.grading.provenance import native_code_allowed, read_sources, require_clean_sources
from infracourse.failures import LabCheckFailed

REPO = Path(__file__).resolve().parent.parent
FORGERS = REPO / "tests" / "fixtures" / "provenance" / "week07"


def constructs(code: str, native_code: bool = False) -> list[str]:
    tree = ast.parse(textwrap.dedent(code))
    return [f.construct for f in scan_module(tree, "mod.py", native_code=native_code)]


# (snippet, a construct it must be flagged for)
FORBIDDEN = {
    "sys._getframe": ("import sys\nsys._getframe(1)", "sys._getframe"),
    "_getframe imported by name": ("from sys import _getframe as g\ng(2)", "sys._getframe"),
    "sys aliased": ("import sys as s\nframe = s._getframe()", "sys._getframe"),
    "inspect.currentframe": ("import inspect\ninspect.currentframe()", "inspect.currentframe"),
    "inspect.stack": ("import inspect\ninspect.stack()", "inspect.stack"),
    "inspect.getmembers of an object": ("import inspect\ninspect.getmembers(object())", "inspect.getmembers"),
    "f_back": ("def f(frame):\n    return frame.f_back", "f_back"),
    "f_globals": ("def f(frame):\n    return frame.f_globals", "f_globals"),
    "f_locals by getattr": ("def f(frame):\n    return getattr(frame, 'f_locals')", "getattr(..., 'f_locals')"),
    "tb_frame": ("def f(tb):\n    return tb.tb_frame", "tb_frame"),
    "gi_frame": ("def f(g):\n    return g.gi_frame", "gi_frame"),
    "__traceback__": ("try:\n    1 / 0\nexcept Exception as e:\n    t = e.__traceback__", "__traceback__"),
    "sys.exc_info": ("import sys\nsys.exc_info()", "sys.exc_info"),
    "gc.get_objects": ("import gc\ngc.get_objects()", "gc.get_objects"),
    "gc.get_referrers": ("import gc\ngc.get_referrers(1)", "gc.get_referrers"),
    "gc.get_referents": ("from gc import get_referents\nget_referents(1)", "gc.get_referents"),
    "sys.modules read": ("import sys\nm = sys.modules['infracourse.observe']", "sys.modules"),
    "sys.modules imported": ("from sys import modules", "sys.modules"),
    "sys.modules by getattr": ("import sys\ngetattr(sys, 'modules')", "sys.modules"),
    "sys.meta_path": ("import sys\nsys.meta_path.insert(0, None)", "sys.meta_path"),
    "import __main__": ("import __main__", "__main__"),
    "'__main__' string": ("import importlib\nm = importlib.import_module('__main__')", "__main__"),
    "ctypes in a kernel lab": ("import ctypes", "ctypes"),
    "cffi": ("from cffi import FFI", "cffi"),
    "ctypes.pythonapi even where C is allowed": ("import ctypes\nctypes.pythonapi.Py_IncRef", "ctypes.pythonapi"),
    "ctypes.memmove even where C is allowed": ("import ctypes\nctypes.memmove(1, 2, 3)", "ctypes.memmove"),
    "exec of a computed string": ("code = 'x' + '=1'\nexec(code)", "exec() of a computed string"),
    "eval of a computed string": ("eval(input())", "eval() of a computed string"),
    "compile of a computed string": ("compile(open('a').read(), 'a', 'exec')", "compile() of a computed string"),
    "exec passed around": ("run = exec", "exec"),
    "getattr passed around": ("import functools\nfunctools.reduce(getattr, ['f_back'], object())", "getattr"),
    "attrgetter of a frame": ("import operator\noperator.attrgetter('gi_frame.f_back')", "attrgetter('gi_frame')"),
    "attrgetter of a computed name": ("import operator\nname = 'x'\noperator.attrgetter(name)",
                                      "operator.attrgetter() of a computed name"),
    "pickle.loads": ("import pickle\npickle.loads(b'cos\\nsystem\\n')", "pickle.loads"),
    "other threads' exceptions": ("import sys\nsys._current_exceptions()", "sys._current_exceptions"),
    "__import__ of a computed name": ("name = 'o' + 's'\n__import__(name)", "__import__() of a computed name"),
    "import_module of a computed name": ("import importlib\nimportlib.import_module('a' + 'b')",
                                         "import_module() of a computed name"),
    "importlib.util": ("import importlib.util\nimportlib.util.spec_from_file_location('m', '/x.py')",
                       "importlib.util"),
    "runpy": ("import runpy\nrunpy.run_path('x.py')", "runpy"),
    "marshal": ("import marshal\nmarshal.loads(b'')", "marshal"),
    "types.CodeType": ("import types\ntypes.CodeType", "types.CodeType"),
    "import builtins": ("import builtins\nbuiltins.print = print", "builtins"),
    "__builtins__": ("__builtins__['len'] = None", "__builtins__"),
    "patching torch": ("import torch\ntorch.add = lambda x, y: x", "assigning torch.add"),
    "patching a class of torch": ("import torch\ntorch.Tensor.__add__ = None", "assigning torch.Tensor.__add__"),
    "setattr on a module": ("import time\nsetattr(time, 'perf_counter', lambda: 0.0)", "setattr() on time"),
    "setattr on a type": ("def f(x):\n    setattr(type(x), 'run', None)", "setattr() on a type"),
    "assigning to type(x)": ("def f(x):\n    type(x).run = None", "assigning an attribute of a type.run"),
    "getattr of a module by computed name": ("import torch\nname = 'a' + 'dd'\ngetattr(torch, name)",
                                             "getattr() of a computed attribute of torch"),
    "getattr of a name built in the call": ("def f(g):\n    return getattr(g, 'gi_' + 'frame')",
                                            "getattr() of an attribute name built at run time"),
    "__globals__": ("def f(g):\n    return g.__globals__", "__globals__"),
    "__code__": ("def f(g):\n    return g.__code__", "__code__"),
    "__closure__": ("def f(g):\n    return g.__closure__[0].cell_contents", "__closure__"),
    "__subclasses__": ("object.__subclasses__()", "__subclasses__"),
    "__self__": ("def f(m):\n    return m.__self__", "__self__"),
    "__dict__ write": ("def f(o):\n    o.__dict__['x'] = 1", "a write into __dict__"),
    "__dict__ update": ("def f(o):\n    o.__dict__.update(x=1)", "__dict__.update()"),
    "__class__ assignment": ("def f(o):\n    o.__class__ = int", "assigning __class__"),
    "object.__setattr__ on another object": ("import torch\nobject.__setattr__(torch, 'add', None)",
                                             "object.__setattr__ on another object"),
    "the observers": ("from infracourse import observe", "infracourse.observe"),
    "the worker": ("import infracourse.grading.worker", "infracourse.grading"),
    "the grading package by attribute": ("import infracourse\ninfracourse.grading", "infracourse.grading"),
    "/proc/self/mem": ("open('/proc/self/mem', 'rb')", "/proc/self/mem"),
    "/proc/<pid>/mem in an f-string": ("import os\nopen(f'/proc/{os.getpid()}/mem')", "/proc/.../mem"),
    "/proc/self/fd": ("import os\nos.listdir('/proc/self/fd')", "/proc/self/fd"),
    "os.dup2": ("import os\nos.dup2(1, 2)", "os.dup2"),
    "signal handler": ("import signal\nsignal.signal(signal.SIGALRM, print)",
                       "signal.signal() of a signal other than SIGTERM or SIGINT"),
    "setitimer": ("import signal\nsignal.setitimer(signal.ITIMER_REAL, 0.1)", "signal.setitimer"),
    "sys.settrace": ("import sys\nsys.settrace(None)", "sys.settrace"),
    "sys.setprofile": ("import sys\nsys.setprofile(None)", "sys.setprofile"),
    "threading.settrace": ("import threading\nthreading.settrace(None)", "threading.settrace"),
    "sys.addaudithook": ("import sys\nsys.addaudithook(print)", "sys.addaudithook"),
    "torch._C": ("import torch\ntorch._C._unset_dispatch_mode", "torch._C._unset_dispatch_mode"),
    "torch.utils._python_dispatch": ("from torch.utils._python_dispatch import _pop_mode",
                                     "torch.utils._python_dispatch"),
}


@pytest.mark.parametrize("case", list(FORBIDDEN))
def test_each_forbidden_construct_is_caught(case):
    code, expected = FORBIDDEN[case]
    native = case.endswith("where C is allowed")
    assert expected in constructs(code, native_code=native), constructs(code, native_code=native)


HONEST = {
    "a script's main guard": "if __name__ == '__main__':\n    main()",
    "collecting garbage": "import gc\ngc.collect()",
    "a signature": "import inspect\ninspect.signature(print)",
    "a library switch": "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True",
    "setattr on a module object it holds": "def swap(parent, name, new):\n    setattr(parent, name, new(getattr(parent, name)))",
    "compile of a literal": "code = compile('1 + 1', '<expr>', 'eval')",
    "a literal import": "import importlib\nnp = importlib.import_module('numpy')",
    "a SIGTERM handler": "import signal\nsignal.signal(signal.SIGTERM, lambda s, f: None)",
    "the course kit": "from infracourse.kit import gpt\nimport infracourse.kit.probes\nfrom infracourse import bench",
    "its own class's attributes": "class A:\n    pass\nA.x = 1\nsetattr(A, 'y', 2)",
    "frozen dataclass init": "class P:\n    def __init__(self):\n        object.__setattr__(self, 'x', 1)",
    "a foreach op": "import torch\ntorch._foreach_mul_([], 0.5)",
    "torch.compile": "import torch\nf = torch.compile(lambda x: x)",
}


@pytest.mark.parametrize("case", list(HONEST))
def test_honest_constructs_pass(case):
    assert constructs(HONEST[case]) == []


def test_ctypes_is_allowed_only_where_the_lab_hands_out_c():
    assert constructs("import ctypes\nctypes.CDLL('./loop_sum.so').loop_sum", native_code=True) == []
    assert native_code_allowed(["benchmark.py", "loop_sum.c"])
    assert not native_code_allowed(["softmax.py", "softmax_cuda.cu"])


def test_a_compiled_file_in_the_snapshot_is_flagged(tmp_path):
    (tmp_path / "vector_ops.py").write_text("import torch\n")
    (tmp_path / "helper.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (tmp_path / "lib.zip").write_bytes(b"PK")
    found = read_sources(tmp_path)
    assert [f.file for f in found] == ["helper.cpython-312-x86_64-linux-gnu.so", "lib.zip"]
    with pytest.raises(LabCheckFailed, match=r"^helper\.cpython.*\.so:1: a compiled or archived file .*remove it"):
        require_clean_sources(tmp_path)


def test_an_oversized_or_unreadable_source_is_a_finding_not_a_crash(tmp_path):
    (tmp_path / "big.py").write_text("x = 1\n" * 200_000)
    (tmp_path / "deep.py").write_text("x = " + "(" * 150_000 + ")" * 150_000 + "\n")
    (tmp_path / "nul.py").write_bytes(b"x = 1\0\n")  # Python cannot import it either: the worker says so
    found = {f.file: f.construct for f in read_sources(tmp_path)}
    assert found["big.py"].startswith("a source file of 1200000 bytes")
    assert "nul.py" not in found and set(found) <= {"big.py", "deep.py"}


def _lab_files() -> dict[str, list[str]]:
    """'week01' / 'track-nvidia' -> the files its lab.yaml hands out."""
    return {folder.name.split("-")[0] if folder.name.startswith("week") else folder.name:
            yaml.safe_load((folder / "lab.yaml").read_text())["files"] for folder in (REPO / "labs").iterdir()
            if (folder / "lab.yaml").is_file()}


def _honest_folders() -> list[Path]:
    """Every folder holding a learner's answer the course calls honest: solutions, starters, and the honest
    fixtures in other styles (tests/fixtures/honest/**, tests/fixtures/*-honest/**)."""
    files = [*REPO.glob("labs/*/solution/**/*"), *REPO.glob("labs/*/starter/**/*"),
             *REPO.glob("tests/fixtures/honest/**/*"), *REPO.glob("tests/fixtures/*-honest/**/*")]
    return sorted({f.parent for f in files if f.is_file()})


def test_no_honest_file_of_the_course_trips_the_reading():
    labs, folders = _lab_files(), _honest_folders()
    assert len(folders) > 40  # every lab's solution and starter at least
    tripped = {}
    for folder in folders:
        rel = folder.relative_to(REPO).as_posix()
        lab = next((name for name in labs if name in rel), None)
        native = lab is not None and native_code_allowed(labs[lab])
        found = read_sources(folder, native_code=native)
        if found:
            tripped[rel] = [str(f) for f in found]
    assert not tripped, tripped


# ---------------------------------------------------------------- the graded function reaches its kernel
KERNEL_LABS = {"week07-triton-basics": ["vector_ops.add", "vector_ops.reduce_sum"],
               "week08-softmax": ["softmax.softmax"], "week09-matmul": ["matmul.matmul"],
               "week10-fusion": ["rmsnorm.rms_norm"], "track-nvidia": ["fused_norm.rms_norm"]}


def _as_learner(tmp_path: Path, source: Path, module: str) -> Path:
    folder = tmp_path / f"{source.parent.name}-{source.stem}"
    folder.mkdir()
    shutil.copy(source, folder / f"{module}.py")
    return folder


@pytest.mark.parametrize("lab", list(KERNEL_LABS))
def test_solutions_and_honest_styles_reach_their_kernels_and_starters_do_not(lab, tmp_path):
    graded = KERNEL_LABS[lab]
    module = graded[0].split(".")[0]
    honest = REPO / "tests" / "fixtures" / "honest" / lab.split("-")[0]
    folders = [REPO / "labs" / lab / "solution"] + [_as_learner(tmp_path, f, module) for f in sorted(honest.glob("*.py"))]
    if lab == "track-nvidia":  # the project grades its operator's forward kernel; the honest style's backward is torch
        folders.append(REPO / "tests" / "fixtures" / "track-nvidia-honest")
    for folder in folders:
        if not folder.exists():
            continue  # a learner release ships no solution
        for name in graded:
            assert kernel_findings(folder, name, backward=lab == "week10-fusion") == [], (folder, name)
    for name in graded:
        found = kernel_findings(REPO / "labs" / lab / "starter", name)
        assert len(found) == 1 and "launches no @triton.jit kernel" in found[0].construct


def _learner(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    return tmp_path


KERNEL = """
import triton
import triton.language as tl

@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))
"""


def test_a_torch_add_beside_an_unlaunched_kernel_fails(tmp_path):
    folder = _learner(tmp_path, vector_ops=KERNEL + "\nimport torch\n\ndef add(x, y):\n    return torch.add(x, y)\n")
    found = kernel_findings(folder, "vector_ops.add")
    assert [(f.file, f.line) for f in found] == [("vector_ops.py", 12)]
    assert str(found[0]).startswith("vector_ops.py:12: add launches no @triton.jit kernel")


def test_a_launch_in_a_helper_of_another_file_counts(tmp_path):
    folder = _learner(tmp_path, kernels=KERNEL + """
def launch(x, y, out):
    _add_kernel[(1,)](x, y, out, x.numel(), BLOCK=1024)
""", vector_ops="""
import torch
from kernels import launch

def add(x, y):
    out = torch.empty_like(x)
    launch(x, y, out)
    return out
""")
    assert kernel_findings(folder, "vector_ops.add") == []


def test_a_kernel_passed_to_a_launcher_counts(tmp_path):
    folder = _learner(tmp_path, vector_ops=KERNEL + """
def _launcher(kernel):
    def launch(grid, *args):
        kernel[grid](*args)
    return launch

_add = _launcher(_add_kernel)

def add(x, y):
    out = x.new_empty(x.shape)
    _add((1,), x, y, out, x.numel(), 1024)
    return out
""")
    assert kernel_findings(folder, "vector_ops.add") == []


def test_a_subscripted_launch_of_anything_else_does_not_count(tmp_path):
    folder = _learner(tmp_path, vector_ops=KERNEL + """
TABLE = {0: print}

def add(x, y):
    TABLE[0](x)
    return x + y
""")
    assert len(kernel_findings(folder, "vector_ops.add")) == 1


def test_a_backward_in_torch_fails_when_backward_is_graded(tmp_path):
    folder = _learner(tmp_path, rmsnorm=KERNEL + """
import torch

class Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        out = torch.empty_like(x)
        _add_kernel[(1,)](x, w, out, x.numel(), BLOCK=1024)
        return out

    @staticmethod
    def backward(ctx, dy):
        return dy * 2, dy.sum(0), None

def rms_norm(x, w, eps=1e-6):
    return Norm.apply(x, w, eps)
""")
    assert kernel_findings(folder, "rmsnorm.rms_norm") == []  # the forward launches one
    found = kernel_findings(folder, "rmsnorm.rms_norm", backward=True)
    assert len(found) == 1 and found[0].construct.startswith("Norm.backward launches no @triton.jit kernel")
    assert found[0].line == 20  # its def


def test_a_graded_function_the_reading_cannot_find_fails(tmp_path):
    folder = _learner(tmp_path, vector_ops="globals()['add'] = lambda x, y: x + y\n")
    found = kernel_findings(folder, "vector_ops.add")
    assert len(found) == 1 and "not defined by a def" in found[0].construct
    assert "missing.py" in str(kernel_findings(folder, "missing.add")[0])


# ---------------------------------------------------------------- forgers of the worker's records
@pytest.mark.parametrize("forger, construct", [("forged_sys_modules.py", "sys.modules"),
                                               ("forged_gc.py", "gc.get_objects"),
                                               ("forged_frames.py", "sys._getframe")])
def test_each_forger_is_flagged(tmp_path, forger, construct):
    folder = _as_learner(tmp_path, FORGERS / forger, "vector_ops")
    assert construct in [f.construct for f in read_sources(folder)]


@pytest.mark.slow
def test_week07_forged_records_fail_kernel_did_work_and_the_reference_passes(grade_lab):
    """A torch add whose watched calls the worker records as kernel launches (the observers reached through
    sys.modules) passes every record-based defence; the judge's reading fails it. The reference passes."""
    forged = (FORGERS / "forged_sys_modules.py").read_text()
    result, checks = grade_lab("week07", edits={"vector_ops.py": forged})
    kernel = checks["kernel-did-work"]
    assert kernel.status == "failed", (kernel.status, kernel.message)
    assert kernel.message.startswith("vector_ops.py:9: sys.modules: import what you need by name"), kernel.message
    # torch's answers are right, but every check resting on a watched call reads the same files first
    assert {checks[c].status for c in ("add-correct", "reduce-correct", "masks")} == {"failed"}
    assert not result.complete
    _, reference = grade_lab("week07", checks=["kernel-did-work"])  # that check (and what it requires) alone:
    assert reference["kernel-did-work"].status == "passed", reference["kernel-did-work"].message  # test_week07 grades all


def test_a_watched_call_fails_on_the_files_an_unwatched_one_runs(tmp_path):
    """Any check that reads a record of the worker (a watched call, in any week) reads the files first."""
    from infracourse.grading.remote import WorkerClient

    (tmp_path / "mod.py").write_text("import gc\n_seen = len(gc.get_referrers(object))\n\ndef f(x):\n    return x\n")
    worker = WorkerClient(tmp_path, gpu=False)
    try:
        f = worker.module("mod").f
        assert f(3) == 3
        with pytest.raises(LabCheckFailed, match=r"^mod\.py:2: gc\.get_referrers: remove it"):
            f.call((3,), watch={"poison": False})
    finally:
        worker.close()


# ---------------------------------------------------------------- flagged for the instructor in a regrade
def test_regrade_stores_and_shows_the_findings_of_a_bundle(tmp_path):
    from infracourse.cohort import outcome, synthetic
    from infracourse.cohort.cli import _flagged
    from infracourse.grading.results import GradeResult

    course = synthetic.write_course(tmp_path / "course", weeks=1, kernel_weeks=())
    lab, hardware = course.lab("week01"), synthetic._CPU
    fields = dict(learner="learner000", week="week01", created_at="2026-02-01T10:00:00Z", infracourse_version="x",
                  graders_sha256=synthetic.graders_digest(lab), environment=hardware.as_dict(), ceilings=None)
    claimed = synthetic.result_for(lab, hardware, None, solved=True, share=1, started_at="2026-02-01T10:00:00")
    forged = "import sys\nsys.modules['__main__']\n" + synthetic.SOLUTION  # passes its checks, reaches the worker
    outcomes = {}
    for name, source in (("clean", synthetic.SOLUTION), ("forged", forged)):
        path = synthetic.write_bundle(tmp_path / f"{name}.zip", fields, {"answer.py": source.encode()},
                                      claimed.as_dict())
        outcomes[name] = outcome.grade_submission(course, 1, "week01", path.read_bytes, hardware=hardware)
    assert outcomes["clean"].verified.complete and outcomes["clean"].verified.provenance == []
    flagged = outcomes["forged"].verified
    assert flagged.complete, "the checks pass: the flag is for the instructor to read the file"
    assert flagged.provenance[0].startswith("answer.py:2: sys.modules: import what you need by name")
    stored = GradeResult.from_dict(flagged.as_dict())  # what the gradebook and a worker's Outcome carry
    assert stored.provenance == flagged.provenance
    assert _flagged(stored.provenance) == " (flagged: answer.py:2 sys.modules; 1 more: read the file)"
    assert _flagged([]) == ""
