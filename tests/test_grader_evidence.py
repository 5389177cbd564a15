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
