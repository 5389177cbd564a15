"""Does the graded function launch a `@triton.jit` kernel? Read statically off the learner's files
(grading.provenance's part (b)): the judge never imports them.

The learner's modules are the snapshot's .py files. From the graded function, every learner function, class,
method and module-level name it refers to is followed (a helper in another file too); a call
`X.apply(...)` of a learner's torch.autograd.Function reaches a kernel only if its forward and its backward
both do. A launch is `K[grid](...)` where K is a `@triton.jit` kernel, a module-level name made from one
(`tuned = triton.autotune(...)(kernel)`), or a local name or argument (`kernel, tiles = ...`) in a reading
that also refers to a kernel. A method called on an object the reading cannot type (`self.engine.run()`) is
followed to every learner method of that name.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from infracourse.grading.findings import MAX_SOURCE_BYTES, Finding


@dataclass
class _Module:
    rel: str
    symbols: dict[str, ast.AST] = field(default_factory=dict)  # top-level def, class, or assigned value
    imports: dict[str, str] = field(default_factory=dict)      # local name -> dotted name it imports
    kernels: set[str] = field(default_factory=set)             # top-level names that are, or hold, kernels


def kernel_findings(root: Path, graded: str, *, backward: bool = False) -> list:
    """[] when `graded` ('vector_ops.add', 'rmsnorm.rms_norm') reaches a kernel launch, else one Finding saying
    where it is defined and what to do. With `backward`, every torch.autograd.Function it applies must launch
    a kernel in its forward and in its backward."""
    modules = _modules(Path(root).resolve())
    module_name, _, qualname = graded.partition(".")
    module = modules.get(module_name)
    if module is None or not qualname:
        return [Finding(f"{module_name}.py", 1, f"{graded} not found",
                        f"define {qualname or graded} in {module_name}.py with def, as the handout asks")]
    node = _lookup(module, qualname.split("."))
    if node is None:
        return [Finding(module.rel, 1, f"{qualname} is not defined by a def the grader can read",
                        f"define {qualname} with def (or class) in {module.rel}, not by building it at run time")]
    reader = _Reach(modules, backward)
    if reader.reaches(module, node):
        return []
    rel, line, what = reader.missing or (module.rel, getattr(node, "lineno", 1), qualname)
    return [Finding(rel, line,
                    f"{what} launches no @triton.jit kernel (kernel[grid](...)), itself or "
                    "through the functions it calls", "compute the answer in your own @triton.jit kernel and launch "
                    "it there")]


def _modules(root: Path) -> dict[str, _Module]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        if path.is_symlink() or "__pycache__" in path.parts or path.stat().st_size > MAX_SOURCE_BYTES:
            continue  # a file the reading of forbidden constructs refuses already
        rel = path.relative_to(root).as_posix()
        dotted = rel[:-3].replace("/", ".").removesuffix(".__init__")
        try:
            found[dotted] = _read(rel, ast.parse(path.read_text(errors="replace")))
        except (SyntaxError, ValueError, RecursionError):
            continue
    return found


def _read(rel: str, tree: ast.Module) -> _Module:
    module = _Module(rel)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            module.symbols[node.name] = node
            if isinstance(node, ast.FunctionDef) and any(_is_jit(d, module) for d in node.decorator_list):
                module.kernels.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        module.symbols[name.id] = node.value
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module.imports[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                module.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    changed = True
    while changed:  # names made from kernels (autotuned, wrapped) hold kernels too
        held = {name for name, value in module.symbols.items() if not isinstance(value, (ast.FunctionDef,
                ast.AsyncFunctionDef, ast.ClassDef)) and _names(value) & module.kernels}
        changed = bool(held - module.kernels)
        module.kernels |= held
    return module


def _is_jit(decorator: ast.AST, module: _Module) -> bool:
    """@triton.jit, @triton.jit(...), @jit (from triton import jit), and the autotune/heuristics stacked on them."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    parts = []
    while isinstance(target, ast.Attribute):
        parts.append(target.attr)
        target = target.value
    if not isinstance(target, ast.Name):
        return False
    dotted = ".".join([module.imports.get(target.id, target.id), *reversed(parts)])
    return dotted in ("triton.jit", "triton.runtime.jit.jit")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _lookup(module: _Module, path: list[str]) -> ast.AST | None:
    node = module.symbols.get(path[0])
    for part in path[1:]:
        if not isinstance(node, ast.ClassDef):
            return None
        node = next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
    return node


class _Reach:
    def __init__(self, modules: dict[str, _Module], backward: bool):
        self.modules, self.backward = modules, backward
        self.memo: dict[tuple[int, bool], bool] = {}
        self.missing: tuple | None = None  # (file, line, name) of an autograd.Function's part that reaches none

    def reaches(self, module: _Module, node: ast.AST, seen: bool = False) -> bool:
        """`seen`: a definition on the way here referred to a kernel, so a launch of a local name or argument
        (`kernel[grid](...)` in a launcher the kernel was passed to) launches one."""
        seen = seen or self._refers_to_kernel(module, node)
        key = (id(node), seen)
        if key not in self.memo:
            self.memo[key] = False  # a cycle reaches nothing new
            self.memo[key] = self._reaches(module, node, seen)
        return self.memo[key]

    def _reaches(self, module: _Module, node: ast.AST, seen: bool) -> bool:
        local = _local_names(node)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Subscript):
                base = sub.func.value
                while isinstance(base, ast.Subscript):  # KERNELS[dtype][grid](...)
                    base = base.value
                if self._is_kernel(module, base) or seen and (
                        isinstance(base, ast.Name) and base.id in local or isinstance(base, ast.Attribute)
                        and self._resolve(module, base) is None):
                    return True
            if self.backward and isinstance(sub, ast.Attribute) and sub.attr == "apply":
                found = self._resolve(module, sub.value)
                if found and isinstance(found[1], ast.ClassDef) and not self._function_reaches(found[0], found[1]):
                    return False
        return any(self.reaches(m, n, seen) for m, n in self._callees(module, node) if n is not node)

    def _function_reaches(self, module: _Module, cls: ast.ClassDef) -> bool:
        """An autograd.Function: forward and backward must each launch a kernel."""
        for part in cls.body:
            if isinstance(part, ast.FunctionDef) and part.name in ("forward", "backward") \
                    and not self.reaches(module, part):
                self.missing = self.missing or (module.rel, part.lineno, f"{cls.name}.{part.name}")
                return False
        return True

    def _is_kernel(self, module: _Module, node: ast.AST) -> bool:
        found = self._resolve(module, node)
        return found is not None and found[2] in found[0].kernels

    def _refers_to_kernel(self, module: _Module, node: ast.AST) -> bool:
        return any(self._is_kernel(module, n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute)))

    def _resolve(self, module: _Module, node: ast.AST) -> tuple[_Module, ast.AST, str] | None:
        """(module, definition, name) of a learner name: `helper`, `helpers.helper`, `from helpers import helper`,
        `Class.method`."""
        if isinstance(node, ast.Name):
            if node.id in module.symbols:
                return module, module.symbols[node.id], node.id
            owner, _, name = module.imports.get(node.id, "").rpartition(".")
            target = self.modules.get(owner)
            return (target, target.symbols[name], name) if target and name in target.symbols else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = self.modules.get(module.imports.get(node.value.id, ""))
            if target and node.attr in target.symbols:
                return target, target.symbols[node.attr], node.attr
            found = self._resolve(module, node.value)
            if found and isinstance(found[1], ast.ClassDef):
                method = _lookup(found[0], [found[2], node.attr])
                return (found[0], method, node.attr) if method is not None else None
        return None

    def _callees(self, module: _Module, node: ast.AST):
        """Learner definitions the node refers to: names, module attributes, and methods by name."""
        for sub in ast.walk(node):
            if not isinstance(sub, (ast.Name, ast.Attribute)):
                continue
            found = self._resolve(module, sub)
            if found is not None:
                yield found[0], found[1]
            elif isinstance(sub, ast.Attribute):
                for other in self.modules.values():
                    for definition in other.symbols.values():
                        if isinstance(definition, ast.ClassDef):
                            method = _lookup(other, [definition.name, sub.attr])
                            if method is not None:
                                yield other, method


def _local_names(node: ast.AST) -> set[str]:
    """Arguments and assigned names of a function (and of the functions nested in it)."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.arg):
            names.add(sub.arg)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.add(sub.id)
    return names


def _on_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")

