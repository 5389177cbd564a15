"""The package's import graph (tests/importgraph.py, read with `ast`): no import circles, function-local imports
included (a local import that only hides a circle still is one), and every function-local import of the
package's own modules says why it is not at the top (start-up speed, a sandbox's kit view), in a comment on its
run of import lines or alone on the line above."""
from __future__ import annotations

import importgraph

# Being reworked in this round by other tasks of issue 28, which remove these; each entry must still hold
# (a stale one fails below: delete it).
PENDING_EDGES: dict[tuple[str, str], str] = {}  # edges being reworked (none left)
PENDING_FILES: dict[str, str] = {}  # function-local imports without a reason yet (none left)


def _edges_without_pending() -> dict[str, set[str]]:
    edges = importgraph.graph()
    for importer, imported in PENDING_EDGES:
        edges[importer].discard(imported)
    return edges


def test_the_graph_is_read():
    """The reading finds what a look at the sources shows: a module-level and a function-local import."""
    found = {(i.importer, i.imported, i.local) for i in importgraph.imports()}
    assert ("infracourse.grading.plugin", "infracourse.grading.shared", False) in found
    assert ("infracourse.cli", "infracourse.workspace", True) in found
    assert "infracourse.grading.report_check" in importgraph.modules()


def test_cycles_finds_a_circle_and_names_it():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert importgraph.cycles(edges) == [["a", "b", "c", "a"]]
    assert importgraph.cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    circles = importgraph.cycles(_edges_without_pending())
    lines = []
    for circle in circles:
        steps = [next(i.where() for i in importgraph.imports() if (i.importer, i.imported) == pair)
                 for pair in zip(circle, circle[1:])]
        lines.append(" -> ".join(circle) + f" (at {', '.join(steps)})")
    assert not circles, "import circles (move the shared piece down into a module of its own):\n" + "\n".join(lines)


def test_pending_edges_still_exist():
    edges = importgraph.graph()
    stale = [pair for pair in PENDING_EDGES if pair[1] not in edges[pair[0]]]
    assert not stale, f"no longer imported: {stale}; delete them from PENDING_EDGES"


def test_every_function_local_import_says_why():
    local = [i for i in importgraph.imports() if i.local and not i.reason]
    unexplained = [f"{i.where()} imports {i.imported}" for i in local
                   if str(i.path.relative_to(importgraph.SRC.parent)) not in PENDING_FILES]
    assert not unexplained, ("function-local imports without a reason: move each to the module's top, or say in "
                             "a comment why it must stay (`# why: start-up: ...`):\n" + "\n".join(unexplained))
    files = {str(i.path.relative_to(importgraph.SRC.parent)) for i in local}
    stale = sorted(set(PENDING_FILES) - files)
    assert not stale, f"{stale} have no unexplained local import left: delete them from PENDING_FILES"


def _private_crossings(source: str, importer: str) -> list[str]:
    """`module._name` and `from module import _name` where module is another of the package's modules: a private
    name used across a module line (one leading underscore; dunders are Python's)."""
    import ast

    known = importgraph.modules()
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the package module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.asname:  # `import a.b` binds `a`, whose attributes are modules
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("infracourse"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    aliases[alias.asname or alias.name] = full
                elif alias.name.startswith("_") and not alias.name.startswith("__") and node.module != importer:
                    found.append(f"from {node.module} import {alias.name} (line {node.lineno})")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")
                and aliases[node.value.id] != importer):
            found.append(f"{aliases[node.value.id]}.{node.attr} (line {node.lineno})")
    return found


def test_the_private_name_reader_finds_both_forms():
    source = ("from infracourse import bench\nimport infracourse.kit.loadgen as lg\n"
              "from infracourse.kit.loadgen import _stream\nbench._hold(1)\nlg._x\nbench.__name__\n")
    assert sorted(_private_crossings(source, "infracourse.grading.worker")) == [
        "from infracourse.kit.loadgen import _stream (line 3)", "infracourse.bench._hold (line 4)",
        "infracourse.kit.loadgen._x (line 5)"]


def test_no_private_name_crosses_a_module_line():
    """What another module uses is that module's public name: a private one crossing a line is an interface
    nobody declared (issue 28 counted 15; bench's timing helpers and loadgen's body readers were the last)."""
    crossings = {name: found for name, path in importgraph.modules().items()
                 if (found := _private_crossings(path.read_text(), name))}
    assert not crossings, crossings
