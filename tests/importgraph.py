"""The package's own import graph, read from its source with `ast` (nothing is imported): which module of
src/infracourse imports which, at module level or inside a function. Imports under `if TYPE_CHECKING:` are left
out: they never run. Shared by the import tests (tests/test_import_graph.py)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PACKAGE = "infracourse"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module, dotted
    imported: str  # the module it loads (a package's __init__ as the package's name)
    path: Path
    line: int  # the statement's first line
    local: bool  # inside a function: runs when called, not when the importer is loaded
    reason: str  # the comment of its run of import statements, or alone on the line above the run ('' when none)

    def where(self) -> str:
        return f"{self.path.relative_to(SRC.parent)}:{self.line}"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _resolve(importer: str, path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The package's modules a statement loads (`from a.b import c` loads a.b.c when c is a module, else a.b)."""
    known = modules()
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    base = node.module or ""
    if node.level:  # relative: from the importer's package
        package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    found = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
    if base in known and len(found) < len(node.names):
        found.append(base)
    return found


def _comment(lines: list[str], first: int, last: int) -> str:
    """A `#` comment on lines first..last (1-based, inclusive: a run of import statements) or alone on the line
    above them."""
    for text in lines[first - 1:last]:
        if "#" in text:
            return text.split("#", 1)[1].strip()
    above = lines[first - 2].strip() if first >= 2 else ""
    return above[1:].strip() if above.startswith("#") else ""


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


@cache
def imports() -> tuple[Import, ...]:
    """Every import of one of the package's modules by another, in file order."""
    found: list[Import] = []
    for name, path in modules().items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()

        def walk(node: ast.AST, local: bool) -> None:
            runs: list[list[ast.stmt]] = []  # import statements on adjacent lines share one reason
            for child in ast.iter_child_nodes(node):
                if _type_checking(child):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if runs and runs[-1][-1].end_lineno + 1 == child.lineno:
                        runs[-1].append(child)
                    else:
                        runs.append([child])
                inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                walk(child, inner)
            for run in runs:
                reason = _comment(lines, run[0].lineno, run[-1].end_lineno)
                for statement in run:
                    found.extend(Import(name, target, path, statement.lineno, local, reason)
                                 for target in _resolve(name, path, statement) if target != name)

        walk(ast.parse(text, filename=str(path)), False)
    return tuple(found)


def graph(*, local: bool = True) -> dict[str, set[str]]:
    """importer -> the modules it imports (with the function-local imports unless `local` is False)."""
    edges: dict[str, set[str]] = {name: set() for name in modules()}
    for imp in imports():
        if local or not imp.local:
            edges[imp.importer].add(imp.imported)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One import circle per strongly connected group of modules (Tarjan), each as a path a -> b -> ... -> a."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the package's ~150 modules
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_circle(group, edges) for group in groups]


def _circle(group: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges[node] & members):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return group  # not reached: a strongly connected group holds a circle through each member
