"""Which modules of the course kit a week's confined code can see.

The kit holds engines built for later weeks (week 17's continuous-batching pool, week 18's speculative
decoder): imported by an earlier week's lab, they would answer it. So a week's sandbox mounts only the kit
modules its handout names (lab.yaml `kit`), the modules its graders name for the worker (probes, drivers), what
the worker itself runs (grading/inputs.py builds kit.gpt batches), and every kit module those import in turn.
The list is read from the sources, statically: nothing of the kit is imported to compute it.
"""
from __future__ import annotations

import ast
import os
import re
from functools import lru_cache
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parent
KIT_DIR = ENGINE_DIR / "kit"
# The engine modules that run inside the sandbox: the worker (and what it imports of the engine), and the
# driver torchrun starts in every rank.
WORKER_ENTRIES = ("infracourse.grading.worker", "infracourse.kit.rank_driver", "infracourse.kit.rank_launcher")
# The runner hands the judge the week's lists; the judge's sandbox reads them (see sandbox.wrap).
VISIBLE_ENV = "INFRACOURSE_KIT"
HANDOUT_ENV = "INFRACOURSE_KIT_HANDOUT"
HANDOUT_FILE = "_week_kit.txt"  # in the sandbox's kit folder: the handout's list, for kit/__init__'s message
_NAMED = re.compile(r"infracourse\.kit\.([A-Za-z_][A-Za-z0-9_]*)")


def kit_modules() -> set[str]:
    """Every module of the kit, by its short name (`gpt`, `batching`)."""
    return {p.stem for p in KIT_DIR.glob("*.py") if p.stem != "__init__"}


def references(source: Path) -> tuple[set[str], set[str]]:
    """(kit modules, other engine modules) that a Python file imports or names in a string (a grader names the
    course module the worker imports: `learner.module("infracourse.kit.probes")`)."""
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    in_kit = source.resolve().parent == KIT_DIR
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1 and in_kit:  # `from . import gpt` / `from .gpt import GPT` inside the kit
                base = "infracourse.kit" + (f".{base}" if base else "")
            names.update(f"{base}.{alias.name}" for alias in node.names)
            names.add(base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(f"infracourse.kit.{m}" for m in _NAMED.findall(node.value))
    kit, engine = set(), set()
    for name in names:
        parts = name.split(".")
        if parts[:2] == ["infracourse", "kit"] and len(parts) > 2:
            kit.add(parts[2])
        elif parts[0] == "infracourse" and len(parts) > 1:
            engine.add(".".join(parts))
    return kit & kit_modules(), engine


def closure(names: set[str]) -> set[str]:
    """`names` with every kit module they import, transitively."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen or not (KIT_DIR / f"{name}.py").is_file():
            continue
        seen.add(name)
        todo += references(KIT_DIR / f"{name}.py")[0]
    return seen


@lru_cache(maxsize=1)
def worker_needs() -> frozenset[str]:
    """The kit modules the engine's own code inside the sandbox imports (walked from WORKER_ENTRIES)."""
    kit = {name.split(".")[2] for name in WORKER_ENTRIES if name.startswith("infracourse.kit.")}
    seen: set[Path] = set()
    todo = [_source_of(name) for name in WORKER_ENTRIES]
    while todo:
        path = todo.pop()
        if path is None or path in seen:
            continue
        seen.add(path)
        found_kit, found_engine = references(path)
        kit |= found_kit
        todo += [_source_of(name) for name in found_engine]
    return frozenset(closure(kit))


def _source_of(module: str) -> Path | None:
    """The engine file of `infracourse.a.b` (a module or a package's __init__), or None (a name imported from a
    module rather than a module)."""
    relative = Path(*module.split(".")[1:])
    for candidate in (ENGINE_DIR / relative.with_suffix(".py"), ENGINE_DIR / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def visible(handout: list[str], graders: Path) -> list[str]:
    """The kit modules a week's sandbox mounts (see the module docstring)."""
    return sorted(closure(set(handout) | named_in(graders) | worker_needs()))


def environment(handout: list[str], graders: Path) -> dict[str, str]:
    """What the runner passes the judge, so that every sandbox of the grade mounts this week's kit only."""
    return {VISIBLE_ENV: ",".join(visible(handout, graders)), HANDOUT_ENV: ",".join(handout)}


def from_environment() -> tuple[list[str], list[str]] | None:
    """(visible, handout) set by the runner for this grade; None outside a grade (the engine's own tests, a
    worker started by hand), where the whole kit is mounted."""
    if VISIBLE_ENV not in os.environ:
        return None
    split = lambda value: [n for n in value.split(",") if n]  # noqa: E731
    return split(os.environ[VISIBLE_ENV]), split(os.environ.get(HANDOUT_ENV, ""))


def named_in(folder: Path) -> set[str]:
    """The kit modules the Python files of a folder import or name (a lab's starter or solution, a week's
    graders, which name the modules the worker imports for them)."""
    found: set[str] = set()
    for path in sorted(folder.rglob("*.py")) if folder.is_dir() else []:
        found |= references(path)[0]
    return found


def data_files(modules: list[str]) -> list[Path]:
    """The kit's non-Python files (a C source, a JSON index) that one of `modules` names."""
    texts = [(KIT_DIR / f"{m}.py").read_text(encoding="utf-8") for m in modules if (KIT_DIR / f"{m}.py").is_file()]
    return [p for p in sorted(KIT_DIR.iterdir())
            if p.is_file() and p.suffix != ".py" and any(p.name in text for text in texts)]


def handout_problems(lab_dir: Path, kit: list[str]) -> list[str]:
    """What `infracourse dev check` reports of a lab's `kit`: a kit module the starter or the solution imports
    that the list lacks (it would not be mounted), or a listed module the handout never names."""
    problems = []
    for side in ("starter", "solution"):
        missing = sorted(named_in(lab_dir / side) - set(kit))
        if missing:
            problems.append(f"{lab_dir}/lab.yaml: kit lacks {missing}, which {side}/ imports; add them to `kit` "
                            "and name them in README.md")
    readme = (lab_dir / "README.md").read_text(encoding="utf-8") if (lab_dir / "README.md").is_file() else ""
    unnamed = sorted(m for m in kit if not re.search(rf"\bkit(\.|/| import [\w, ]*\b){m}\b", readme)
                     and m not in named_in(lab_dir / "starter"))
    if unnamed:
        problems.append(f"{lab_dir}/lab.yaml: kit lists {unnamed}, which neither README.md nor the starter names; "
                        "name them in the handout or remove them from `kit`")
    return problems
