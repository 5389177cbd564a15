"""The benchmarks in benchmarks/ stay runnable as the package moves: every name a script imports from the
package exists (two scripts still imported names an earlier refactor had moved or renamed, and only failed
when somebody ran them). Read with `ast`, so no benchmark's main runs and no GPU is needed."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py"))


def package_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) of each import of the package's modules in a script."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "infracourse":
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names if alias.name.split(".")[0] == "infracourse"]
    return found


def test_the_reader_finds_both_forms(tmp_path):
    script = tmp_path / "b.py"
    script.write_text("import infracourse.bench\nimport os\ndef f():\n    from infracourse.kit import loadgen, nope\n")
    assert sorted(package_imports(script)) == [("infracourse.bench", None, 1), ("infracourse.kit", "loadgen", 4),
                                               ("infracourse.kit", "nope", 4)]


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_every_package_name_a_benchmark_imports_exists(script):
    missing = []
    for module, name, line in package_imports(script):
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            missing.append(f"line {line}: import {module} ({error})")
            continue
        if name is not None and not hasattr(loaded, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"line {line}: {name} is not in {module}")
    assert not missing, f"{script.name}: " + "; ".join(missing)
