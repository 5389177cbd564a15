"""Graders use the engine through its front door (infracourse.grader, docs/authoring.md): no grader imports the
grading package, the observers or the words module directly, none imports from a conftest (a week's shared
helpers live in its week-unique <week>_judging.py), none reaches a private name, and none names a worker object
by a "module:name" string. Each rule is shown catching a violation, then held over every grader file."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GRADERS = REPO / "graders"
# what a grader may import of the engine: the front door, the course kit and the learner-facing harness (both
# also the learner's) and the device's ceilings (week 20 starts its deploy command through the front door's `launch`)
ALLOWED = ("infracourse.grader", "infracourse.kit", "infracourse.bench", "infracourse.hardware")


def violations(source: str, filename: str = "grader.py") -> list[str]:
    """Every breach of the front-door rules in one grader file, as 'file:line: what'."""
    found = []

    def flag(node, what):
        found.append(f"{filename}:{node.lineno}: {what}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
            if node.module == "infracourse":  # from infracourse import grading / bench
                modules = [f"infracourse.{alias.name}" for alias in node.names]
            for module in modules:
                _check_module(module, node, flag)
            for alias in node.names:
                if alias.name.startswith("_") and node.module != "__future__":
                    flag(node, f"imports the private name {alias.name} from {node.module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                _check_module(alias.name, node, flag)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_") and not node.attr.startswith("__") and \
                    not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                flag(node, f"reaches the private attribute {ast.unparse(node)}")
            if isinstance(node.value, ast.Name) and node.value.id == "infracourse" and not node.attr.startswith("__") \
                    and not f"infracourse.{node.attr}".startswith(ALLOWED):
                flag(node, f"reaches {ast.unparse(node)} past the front door")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "BuildInWorker":
            flag(node, "names a worker object by a string: in_worker(kit_function, ...) or learner.build(...)")
    return found


def _check_module(module: str, node, flag) -> None:
    if module == "conftest" or module.startswith("conftest."):
        flag(node, "imports from conftest: shared helpers go in the week's <week>_judging.py, or a fixture")
    elif module.startswith("infracourse.") and not module.startswith(ALLOWED):
        flag(node, f"imports {module}: a grader imports the engine from infracourse.grader")


@pytest.mark.parametrize("source, what", [
    ("from infracourse.grading.perf import timed", "infracourse.grading.perf"),
    ("from infracourse.guard import LabCheckFailed", "infracourse.guard"),
    ("from infracourse.failures import LabCheckFailed", "infracourse.failures"),
    ("from infracourse import grading", "infracourse.grading"),
    ("import infracourse.grading.remote", "infracourse.grading.remote"),
    ("import infracourse\ninfracourse.grading.perf.timed", "infracourse.grading past the front door"),
    ("from conftest import require", "conftest"),
    ("def f(fn):\n    return fn._handle", "fn._handle"),
    ("from infracourse.kit.porting import _traced", "_traced"),
    ("x = BuildInWorker('infracourse.kit.gpt:GPTConfig')", "by a string"),
])
def test_each_rule_catches_its_breach(source, what):
    found = violations(source)
    assert len(found) == 1 and what in found[0], found


@pytest.mark.parametrize("source", [
    "from infracourse.grader import LabCheckFailed, in_worker, timed",
    "from infracourse.kit import probes\nfrom infracourse.kit.gpt import GPTConfig\nfrom infracourse import bench",
    "import infracourse\nroot = infracourse.__file__",
    "class A:\n    def f(self):\n        return self._cache",
    "from week17_judging import require\nimport torch",
])
def test_what_a_grader_may_do_passes(source):
    assert violations(source) == []


def test_every_grader_uses_only_the_front_door():
    found = []
    for path in sorted(GRADERS.rglob("*.py")):
        found += violations(path.read_text(), str(path.relative_to(REPO)))
    assert not found, "\n".join(found)


def test_each_weeks_judging_module_has_a_name_no_other_week_uses():
    names = [p.name for p in GRADERS.rglob("*_judging.py")]
    assert names and len(names) == len(set(names))
    assert all(p.stem == p.parent.name.replace("-", "_") + "_judging" for p in GRADERS.rglob("*_judging.py"))
