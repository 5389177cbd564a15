"""No probe records evidence that nothing reads (issue 29): a key a grader's phase returns, or a field of the
dataclass a grader's fixture hands its checks, that no check reads is evidence collected and never asserted —
a probe that looks like it guards something and does not. Read statically, per grader folder."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

GRADERS = Path(__file__).resolve().parents[1] / "graders"
FOLDERS = sorted(p for p in GRADERS.iterdir() if p.is_dir() and any(p.glob("*.py")))


def phase_keys(tree: ast.AST) -> dict[str, str]:
    """The string keys of the dict literals that `phase_*` functions return: key -> function."""
    keys = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("phase_"):
            for node in ast.walk(fn):
                if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
                    for key in node.value.keys:
                        if isinstance(key, ast.Constant) and isinstance(key.value, str):
                            keys.setdefault(key.value, fn.name)
    return keys


def dataclass_fields(tree: ast.AST) -> dict[str, str]:
    """The fields of the dataclasses a grader module defines: field -> class."""
    fields = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fields[item.target.id] = node.name
    return fields


def reads(tree: ast.AST) -> tuple[set, set]:
    """(keys read: x["k"], x.get("k"), "k" in x; attributes read: x.k, getattr(x, "k"))."""
    keys, attributes = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            keys.add(node.args[0].value)
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)):
            keys.add(node.left.value)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            attributes.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            attributes.add(node.args[1].value)
    return keys, attributes


def unread_evidence(folder: Path) -> list[str]:
    trees = {p.name: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(folder.glob("*.py"))}
    keys, attributes = set(), set()
    for tree in trees.values():
        k, a = reads(tree)
        keys |= k
        attributes |= a
    unread = []
    for name, tree in trees.items():
        unread += [f"{name}: {fn}() returns {key!r}, which no check reads"
                   for key, fn in phase_keys(tree).items() if key not in keys]
        unread += [f"{name}: {cls}.{field} is never read"
                   for field, cls in dataclass_fields(tree).items() if field not in attributes]
    return unread


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_piece_of_evidence_a_grader_collects_is_read(folder):
    assert not unread_evidence(folder), "\n".join(unread_evidence(folder))


def test_the_reader_finds_an_unread_key_and_an_unread_field(tmp_path):
    (tmp_path / "w_judging.py").write_text(
        "from dataclasses import dataclass\n\n@dataclass\nclass Probe:\n    seen: int\n    spare: int\n\n"
        "def phase_load(server):\n    return {'records': 1, 'waited_s': 2, 'full': 3}\n")
    (tmp_path / "test_w.py").write_text(
        "def test_x(p, probe):\n    d = p.get()\n    assert d['records'] and 'full' in d and probe.seen\n")
    assert unread_evidence(tmp_path) == ["w_judging.py: phase_load() returns 'waited_s', which no check reads",
                                         "w_judging.py: Probe.spare is never read"]


def phase_readers(folder: Path) -> dict[str, set[str]]:
    """phase name -> the check ids whose test reads `<fixture>.phases["name"]`, itself or through a function of
    the same file it calls (a shared probe), over a grader folder's tests."""
    readers: dict[str, set[str]] = {}
    for path in sorted(folder.glob("test_*.py")):
        functions = [fn for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
                     if isinstance(fn, ast.FunctionDef)]
        direct = {fn.name: {node.slice.value for node in ast.walk(fn)
                            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                            and isinstance(node.value, ast.Attribute) and node.value.attr == "phases"}
                  for fn in functions}
        for fn in functions:
            ids = [d.args[0].value for d in fn.decorator_list if isinstance(d, ast.Call) and d.args
                   and ast.unparse(d.func).endswith("mark.check") and isinstance(d.args[0], ast.Constant)]
            called = {node.func.id for node in ast.walk(fn)
                      if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in direct}
            for phase in set().union(direct[fn.name], *(direct[name] for name in called)):
                if ids:
                    readers.setdefault(phase, set()).update(ids)
    return readers


def declared_phase_checks(folder: Path) -> dict[str, set[str]] | None:
    """The PHASE_CHECKS literal of a grader's conftest (which phases a partial grade runs), if it has one."""
    conftest = folder / "conftest.py"
    if not conftest.exists():
        return None
    for node in ast.parse(conftest.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PHASE_CHECKS"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return None


@pytest.mark.parametrize("folder", [f for f in FOLDERS if declared_phase_checks(f) is not None], ids=lambda p: p.name)
def test_a_partial_grade_runs_every_phase_its_checks_read(folder):
    """A grader that runs only the phases a partial grade's checks read (PHASE_CHECKS, with the graded_checks
    fixture) must list every check that reads a phase: one missing would find its phase never run when graded
    alone, an error the whole week's grade never shows."""
    declared = declared_phase_checks(folder)
    for phase, ids in phase_readers(folder).items():
        assert phase in declared, f"{folder.name}: phase {phase!r} is read by {sorted(ids)} but PHASE_CHECKS lacks it"
        missing = ids - declared[phase]
        assert not missing, f"{folder.name}: {sorted(missing)} read phase {phase!r}; add them to PHASE_CHECKS"


def test_phase_readers_finds_a_check_reading_a_phase(tmp_path):
    (tmp_path / "test_x.py").write_text('import pytest\n\n@pytest.mark.check("c1")\ndef test_c(graded):\n'
                                        '    probe(graded)\n    return graded.phases["load"].get()\n\n\n'
                                        'def probe(graded):\n    graded.phases["idle"].get()\n')
    (tmp_path / "conftest.py").write_text('PHASE_CHECKS = {"load": {"c2"}}\n')
    assert phase_readers(tmp_path) == {"load": {"c1"}, "idle": {"c1"}}
    assert declared_phase_checks(tmp_path) == {"load": {"c2"}}
