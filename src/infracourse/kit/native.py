"""Week 1's compiled loop: a C file compiled and linked by the system C compiler (`cc`) into a shared library,
loaded with ctypes, run over a seeded list of doubles.

`CompiledLoop` is built in the grading worker, for the learner's C file as for the course's
(`COURSE_LOOP`, asked for as None): the learner's code is compiled and run only there. The grader checks the sums it returns
against its own in-order sum of the same values, and clocks `loops(times)` from its own process."""
from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

COURSE_LOOP = Path(__file__).with_name("loop_sum.c")
SYMBOL = "loop_sum"  # double loop_sum(const double *values, long n)
NO_C_COMPILER = ("no C compiler: `cc` is not on PATH (week 1 compiles loop_sum.c with it). Install one: Debian/Ubuntu "
                 "`sudo apt install build-essential`, Fedora `sudo dnf install gcc`, macOS `xcode-select --install`")


def seeded_values(n: int, seed: int) -> list[float]:
    """n doubles in [-1, 1) from `seed`: the same on the grader's side as in the worker."""
    rng = random.Random(seed)
    return [rng.uniform(-1.0, 1.0) for _ in range(n)]


def compile_shared(source: Path, out_dir: Path) -> Path:
    """cc -O2 -shared -fPIC: the shared library built from `source`, or RuntimeError with the compiler's words."""
    library = Path(out_dir) / (Path(source).stem + ".so")
    if shutil.which("cc") is None:
        raise RuntimeError(NO_C_COMPILER)
    done = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"cc could not compile {Path(source).name}:\n{done.stderr.strip()[-1500:]}")
    return library


class CompiledLoop:
    """`loop_sum` of the C file `source` over n seeded doubles, compiled in a fresh folder of the worker's scratch."""

    def __init__(self, source: str | Path | None, n: int, seed: int):
        source = COURSE_LOOP if source is None else Path(source)  # None: the course's own loop
        library = compile_shared(source, Path(tempfile.mkdtemp(prefix="compiled-loop-")))
        lib = ctypes.CDLL(str(library))
        try:
            self._fn = getattr(lib, SYMBOL)
        except AttributeError:
            raise RuntimeError(f"{Path(source).name} defines no function {SYMBOL}(const double *values, long n)") from None
        self._fn.argtypes = (ctypes.POINTER(ctypes.c_double), ctypes.c_long)
        self._fn.restype = ctypes.c_double
        self.n = n
        self._values = (ctypes.c_double * n)(*seeded_values(n, seed))

    def total(self) -> float:
        return float(self._fn(self._values, self.n))

    def loops(self, times: int) -> int:
        """`times` calls over the same values (0: the round trip alone), for a clock on the grader's side."""
        for _ in range(times):
            self._fn(self._values, self.n)
        return times
