"""The import rules of the trust model, read from the source (ast, function-local imports included):

- the grading worker (grading/worker.py, and what it loads) never loads a judge module: it runs beside the
  learner's code, and what the judge decides must not be reachable from there;
- the course kit (infracourse.kit, which runs inside sandboxes and in learner processes) never imports the
  judge's package infracourse.grading; both start processes through infracourse.launch, which imports neither;
- nothing but infracourse.launch builds a sandbox's command line (sandbox.wrap).

The third rule of issue 28, that `infracourse --help` (and every command that does not grade) loads no torch or
pytest, is enforced by running the CLI: tests/test_cli_imports.py.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
GRADERS = Path(__file__).resolve().parent.parent / "graders"
# What the worker may load of the judge's package: the channel's format, the package itself, and the input
# salting its timed calls share with the judge. Everything else in infracourse.grading is the judge's.
WORKER_SIDE = {"infracourse.grading", "infracourse.grading.worker", "infracourse.grading.protocol",
               "infracourse.grading.inputs"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


MODULES = _modules()


@functools.lru_cache(maxsize=None)
def imports(path: Path, *, local: bool = True) -> frozenset[str]:
    """The infracourse modules a file imports (with `local`, also inside functions): `from a.b import c` names
    a.b.c where that is a module, else a.b; a module brings its parent packages (Python loads them first)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    nodes = ast.walk(tree) if local else iter(_top_level(tree.body))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    named = {m for m in found if m.split(".")[0] == "infracourse"}
    return frozenset({".".join(m.split(".")[:i]) for m in named for i in range(2, m.count(".") + 2)} & set(MODULES))


def _top_level(body: list[ast.stmt]):
    """Statements that run when the module is imported: not function bodies (classes', ifs' and trys' are)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _top_level(getattr(node, field, []) or [])


def loaded(start: str, *, local_everywhere: bool) -> dict[str, list[str]]:
    """Every module `start` can load, each with the chain of imports that reaches it: `start`'s own imports
    including function-local ones, then what those load at import time (with `local_everywhere`, also what
    their functions import)."""
    chains = {start: [start]}
    todo = [start]
    while todo:
        name = todo.pop()
        local = local_everywhere or name == start
        for target in sorted(imports(MODULES[name], local=local)):
            if target not in chains:
                chains[target] = chains[name] + [target]
                todo.append(target)
    return chains


def _judge_modules(chains: dict[str, list[str]]) -> dict[str, list[str]]:
    return {m: chain for m, chain in chains.items() if m.startswith("infracourse.grading") and m not in WORKER_SIDE}


def test_the_import_reader_follows_function_local_and_relative_imports(tmp_path):
    """The reader sees what the rules below depend on: an import inside a function, and a `from x import
    module`, in a file of the package."""
    tree = imports(MODULES["infracourse.grading.worker"])
    assert "infracourse.grading.protocol" in tree  # `from infracourse.grading import protocol`
    assert "infracourse.kit.triton_compat" in tree  # inside a function
    assert "infracourse.kit.triton_compat" not in imports(MODULES["infracourse.grading.worker"], local=False)


def test_the_worker_loads_no_judge_module():
    judge = _judge_modules(loaded("infracourse.grading.worker", local_everywhere=False))
    assert not judge, "the grading worker loads judge modules: " + "; ".join(
        " -> ".join(chain) for chain in judge.values())


def test_the_worker_reaches_no_judge_module_even_through_a_function():
    judge = _judge_modules(loaded("infracourse.grading.worker", local_everywhere=True))
    assert not judge, "; ".join(" -> ".join(chain) for chain in judge.values())


KIT_AND_LAUNCHER = sorted(m for m in MODULES if m.split(".")[:2] in (["infracourse", "kit"], ["infracourse", "launch"])
                          or m == "infracourse.sandbox")


def _grading_reached(module: str, *, local_everywhere: bool) -> list[str]:
    chains = loaded(module, local_everywhere=local_everywhere)
    return [" -> ".join(chain) for m, chain in chains.items() if m.startswith("infracourse.grading")]


@pytest.mark.parametrize("module", KIT_AND_LAUNCHER)
def test_the_kit_and_the_launcher_never_import_the_judge(module):
    """Not in their own code (function-local imports included), not through what loads with them."""
    reached = _grading_reached(module, local_everywhere=False)
    assert not reached, f"{module} imports the judge's package: " + "; ".join(reached)


def test_the_kit_reaches_no_judge_module_even_through_a_function():
    reached = [chain for module in KIT_AND_LAUNCHER for chain in _grading_reached(module, local_everywhere=True)]
    assert not reached, "; ".join(reached)


def test_only_the_launcher_builds_a_sandbox_command_line():
    """sandbox.wrap is called in infracourse.launch alone (the engine and the graders), so every confined
    process gets the same environment, session and output limit."""
    callers = []
    for path in [*SRC.rglob("*.py"), *GRADERS.rglob("*.py")]:
        if path.parent.name == "launch" or path.name == "sandbox.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "wrap" and getattr(node.value, "id", "") == "sandbox":
                callers.append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("sandbox") and \
                    any(a.name == "wrap" for a in node.names):
                callers.append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    assert not callers, f"sandbox.wrap called outside infracourse.launch: {callers}; start it with launch.start"


def test_the_rules_can_fail():
    """The same readers on modules that do reach the judge: the runner (a judge module itself) and the CLI
    (whose grading commands import the judge inside their functions)."""
    assert _judge_modules(loaded("infracourse.grading.runner", local_everywhere=False))
    assert _grading_reached("infracourse.cli", local_everywhere=False)
