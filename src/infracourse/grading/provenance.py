"""The judge's own reading of the learner's sources: what records from the learner's process cannot prove.

The worker's records (ops dispatched, kernels launched, data flow) are made in the process that runs the
learner's code, so a file that reaches the worker's internals can rewrite them. This module reads the files of
the snapshot with `ast` (it never imports or runs them) and reports, each as a `Finding` (file, line,
construct, fix):
- forbidden constructs (`read_sources`, rules in grading.forbidden): what reaches the worker's internals or
  hides code from this reading (frames, `gc`/`inspect` of objects, `sys.modules`, `__main__`, ctypes,
  exec/eval/compile of computed code, computed imports, patching builtins or modules it did not define,
  code-reaching dunders, the engine outside `infracourse.kit`/`bench`/`compare`, /proc/self/mem, signal
  handlers, tracing and audit hooks), and files Python would load that are not source (an extension module,
  bytecode, an archive);
- for a kernel lab (`grading.kernel_reach`), a graded function that reaches no `@triton.jit` launch.

Verdicts (each raises `LabCheckFailed` with the first finding, on one line):
- `require_clean_sources(learner_dir)`: every watched call (grading.remote) runs it on its answer, and a
  check that rests on anything else the worker reports calls it;
- `require_own_implementation(learner_dir, 'moe.py', ('infracourse.kit.moe',), fix)`: a file graded as the
  learner's implementation that calls the grader's reference (mounted for other files, or to read);
- `require_kernel_reached(learner_dir, 'vector_ops.add')`: behind verdicts.require_own_kernel, in a kernel lab's
  kernel-did-work (verdicts.run_watched calls it) and timed checks.
`cohort regrade` stores `read_sources(...)` with each result, for the instructor.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from infracourse.grading.findings import MAX_SOURCE_BYTES, Finding
from infracourse.grading.forbidden import scan_module
from infracourse.grading.kernel_reach import kernel_findings
from infracourse.failures import LabCheckFailed

# Files Python could import or run from the snapshot that are not source this reading can check.
OPAQUE_SUFFIXES = (".so", ".pyd", ".pyc", ".pyo", ".dylib", ".zip", ".egg", ".whl")
NATIVE_SOURCES = (".c", ".cc", ".cpp")  # a lab that hands these out is about calling native code (week 1)


def native_code_allowed(lab_files: list[str]) -> bool:
    """Loading a native library (ctypes, cffi) is the lab's subject when it hands out a C source to build."""
    return any(name.endswith(NATIVE_SOURCES) for name in lab_files)


def read_sources(learner_dir: Path, *, native_code: bool = False) -> list[Finding]:
    """Every forbidden construct in the snapshot's files, in file and line order."""
    files = _learner_files(Path(learner_dir))
    return list(_scan_cached(Path(learner_dir).resolve(), files, native_code))


def require_clean_sources(learner_dir: Path, *, native_code: bool = False) -> None:
    """Fail when the learner's files hold a construct that reaches the grading worker's internals: a check
    that rests on the worker's records calls this first (the records could have been rewritten)."""
    _refuse(read_sources(learner_dir, native_code=native_code))


def require_kernel_reached(learner_dir: Path, graded: str | None, *, native_code: bool = False,
                           backward: bool = False) -> None:
    """Fail unless the snapshot's files are clean (`read_sources`) and `graded` ('vector_ops.add'), when the judge
    knows the name, reaches a `@triton.jit` kernel launch in its own call graph (grading.kernel_reach). With
    `backward`, every torch.autograd.Function it applies must launch a kernel in forward and in backward."""
    findings = read_sources(learner_dir, native_code=native_code)
    if not findings and graded is not None:
        findings = kernel_findings(Path(learner_dir), graded, backward=backward)
    _refuse(findings)


def require_own_implementation(learner_dir: Path, file: str, references: tuple[str, ...], fix: str) -> None:
    """Fail when `file` reaches one of `references` (qualified names: a kit module, or a function of one): the
    grader's own reference, mounted for the learner to read or for other files to use, returned as the learner's
    answer would pass any comparison with it. Imports, attributes through an import's alias, and strings that
    name it all count."""
    path = Path(learner_dir) / file
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return  # the check that imports the file says what is wrong with it
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualified(node) -> str | None:
        if isinstance(node, ast.Name):
            return aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = qualified(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, (ast.Name, ast.Attribute)):
            names = [name] if (name := qualified(node)) else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        for name in names:
            hit = next((ref for ref in references if name == ref or name.startswith(ref + ".")), None)
            if hit:
                raise LabCheckFailed(f"{file}:{node.lineno} reaches {hit}, the grader's reference: {fix}")


def _refuse(findings: list[Finding]) -> None:
    if not findings:
        return
    more = f" (and {len(findings) - 1} more: {', '.join(f'{f.file}:{f.line}' for f in findings[1:4])})" \
        if len(findings) > 1 else ""
    raise LabCheckFailed(f"{findings[0]}{more}. The grader reads your files before it trusts what the grading "
                         "worker recorded")


def _learner_files(root: Path) -> tuple[tuple[str, int, int], ...]:
    """(relative path, size, mtime) of every regular file: the cache key of one snapshot's reading."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
            stat = path.stat()
            found.append((path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime_ns))
    return tuple(found)


@functools.lru_cache(maxsize=32)
def _scan_cached(root: Path, files: tuple, native_code: bool) -> tuple[Finding, ...]:
    findings: list[Finding] = []
    for rel, size, _mtime in files:
        if rel.endswith(OPAQUE_SUFFIXES) or re.search(r"\.so(\.\d+)*$", rel):
            findings.append(Finding(rel, 1, "a compiled or archived file Python can load",
                                    "submit source only (.py, and the .c/.cu the lab asks for); remove it"))
        elif rel.endswith(".py") and size > MAX_SOURCE_BYTES:
            findings.append(Finding(rel, 1, f"a source file of {size} bytes (the grader reads up to "
                                    f"{MAX_SOURCE_BYTES})", "keep data out of .py files; split or shorten it"))
        elif rel.endswith(".py"):
            text = (root / rel).read_text(errors="replace")
            try:
                findings += scan_module(ast.parse(text, filename=rel), rel, native_code=native_code)
            except (SyntaxError, ValueError):
                continue  # it cannot be imported either: the worker reports the error when it tries
            except RecursionError:
                findings.append(Finding(rel, 1, "expressions nested too deeply to read",
                                        "write the code as ordinary statements"))
    return tuple(sorted(findings, key=lambda f: (f.file, f.line)))
