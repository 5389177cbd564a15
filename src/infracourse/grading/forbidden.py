"""The constructs a learner's file may not use, read off its syntax tree (grading.provenance's part (a)).

Each rule names what reaches the grading worker's internals (its frames, objects, modules, memory, channel)
or hides code from a reading of the file (code built from strings, computed imports, patched builtins). The
rules match qualified names ('sys._getframe' however sys was imported), attribute names that only frames,
code objects and closures have, and a few shapes (assignments into modules the file imported, exec of a
computed string). Honest solutions of every lab pass (tests/test_provenance.py reads them all).
"""
from __future__ import annotations

import ast
import builtins
import re

from infracourse.grading.findings import Finding

_FRAMES = "remove it: a function needs no other function's frame or variables; pass what you need as arguments"
_OBJECTS = "remove it: use only the objects your code made and holds (gc.collect() is fine)"
_INSPECT = "remove it (inspect.signature is fine): your code needs no other object's frames, members or closure"
_MODULES = "import what you need by name (import torch): the modules the grading worker loaded are not yours to reach"
_IMPORTS = "import modules with plain import statements naming them"
_TRACING = "remove it: tracing and audit hooks run inside the grader's own code (profile in your own scripts)"
_CTYPES = "remove it: ctypes may call a C function you built, not read or write the interpreter's memory"
_HIDDEN = "write the code in the file itself: code built from strings or bytes cannot be read by the grader"
_PATCH = "leave library, course and builtin objects as they are: call a function of your own instead"
_DUNDER = "remove it: a function's globals, code or closure, or every subclass of a type, reach the grader's objects"
_ENGINE = "import only infracourse.kit (the course components the handout names); the grader's modules are off limits"
_MEMORY = "remove it: the process's memory through /proc holds the grader's objects"
_SIGNALS = "remove it: signal handlers and timers interrupt the grader's own code; time limits are the grader's"
_CHANNEL = "write only files you open by path: the grading worker's own file descriptors are the grader's channel"
_PRIVATE = ("use the public torch/triton API: their private internals (torch._C, torch.utils._python_dispatch) "
            "reach the dispatcher the grader watches with")
_MAIN = "remove it: __main__ is the grading worker's module, not yours (`if __name__ == \"__main__\":` is fine)"
_NATIVE = "this lab needs no native code: compute with Python, torch and Triton (ctypes and cffi load unread code)"

# qualified name (or a prefix of one) -> fix
RULES = {
    **dict.fromkeys(["sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys._getframemodulename", "sys.exc_info",
                     "sys.last_traceback", "sys.last_exc", "traceback.walk_stack", "traceback.walk_tb"], _FRAMES),
    **dict.fromkeys(["inspect.currentframe", "inspect.stack", "inspect.trace", "inspect.getouterframes",
                     "inspect.getinnerframes", "inspect.getframeinfo", "inspect.getclosurevars", "inspect.getmembers",
                     "inspect.getmembers_static", "inspect.getattr_static", "inspect.getgeneratorlocals",
                     "inspect.getcoroutinelocals", "inspect.getasyncgenlocals"], _INSPECT),
    **dict.fromkeys(["gc.get_objects", "gc.get_referrers", "gc.get_referents"], _OBJECTS),
    "sys.modules": _MODULES,
    **dict.fromkeys(["sys.meta_path", "sys.path_hooks", "sys.path_importer_cache", "importlib.util",
                     "importlib.machinery", "importlib.abc", "importlib.reload", "importlib._bootstrap", "runpy",
                     "zipimport", "pkgutil"], _IMPORTS),
    **dict.fromkeys(["sys.settrace", "sys.setprofile", "sys.addaudithook", "sys.monitoring", "sys.remote_exec",
                     "threading.settrace", "threading.setprofile", "threading.settrace_all_threads",
                     "threading.setprofile_all_threads", "_thread"], _TRACING),
    **dict.fromkeys(["ctypes.pythonapi", "ctypes.py_object", "ctypes.PyDLL", "ctypes.pydll", "ctypes.memmove",
                     "ctypes.memset", "ctypes.string_at", "ctypes.wstring_at", "ctypes.cast", "ctypes.addressof",
                     "_ctypes"], _CTYPES),
    **dict.fromkeys(["marshal", "pickle.loads", "types.CodeType", "code.interact", "code.InteractiveInterpreter",
                     "code.InteractiveConsole", "code.compile_command", "codeop"], _HIDDEN),
    "builtins": _PATCH,
    "__main__": _MAIN,
    **dict.fromkeys(["signal.setitimer", "signal.set_wakeup_fd", "signal.alarm", "signal.pthread_kill"], _SIGNALS),
    **dict.fromkeys(["os.dup2", "os.dup"], _CHANNEL),
}
ENGINE_PUBLIC = ("kit", "bench", "compare")  # what handouts tell learners to call (patching them is flagged below)
STOP_SIGNALS = ("SIGTERM", "SIGINT")  # a launcher's stop request: a rank may clean up on it (week 14)
NATIVE_MODULES = ("ctypes", "cffi")
FRAME_ATTRIBUTES = {"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "f_trace", "tb_frame", "gi_frame",
                    "cr_frame", "ag_frame", "gi_code", "cr_code", "ag_code"}
CODE_DUNDERS = {"__globals__", "__code__", "__closure__", "__subclasses__", "__builtins__", "cell_contents",
                "__getattribute__", "__self__", "__traceback__"}
CODE_BUILTINS = {"exec", "eval", "compile", "__import__"}  # allowed only with a literal string argument
REFLECTION = {"getattr", "setattr", "delattr", "vars"}  # judged at their call, so never passed around as values
SETTINGS = ("torch.backends.",)  # library switches a solution may set (allow_tf32)
PRIVATE_OWNERS = ("torch", "triton")
PRIVATE_PUBLISHED = re.compile(r"^torch\._foreach_\w+$|^torch\._ops(\.OpOverload(Packet)?)?$")  # public in all but name
_PROC_MEMORY = re.compile(r"/proc/[^\"']*mem\b")
_PROC_FDS = re.compile(r"/proc/[^\"']*/fd\b")


def scan_module(tree: ast.Module, rel: str, *, native_code: bool = False) -> list:
    reader = _Reader(rel, native_code)
    reader.collect(tree)
    reader.visit(tree)
    return list(reader.findings.values())


class _Reader(ast.NodeVisitor):
    def __init__(self, rel: str, native_code: bool):
        self.rel, self.native_code = rel, native_code
        self.aliases: dict[str, str] = {}  # a name the file bound by import -> what it names ('sys._getframe')
        self.defined: set[str] = set()     # classes and functions the file defines
        self.findings: dict = {}           # (line, construct) -> Finding, one each

    def collect(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname \
                        else alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)

    def flag(self, node: ast.AST, construct: str, fix: str) -> None:
        line = getattr(node, "lineno", 1)
        self.findings.setdefault((line, construct), Finding(self.rel, line, construct, fix))

    def qualified(self, node: ast.AST) -> str | None:
        """'sys._getframe' for sys._getframe, s._getframe (import sys as s) or _getframe (from sys import ...);
        'builtins.exec' for a bare builtin name; None for anything else."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            return f"builtins.{node.id}" if hasattr(builtins, node.id) and node.id not in self.defined else None
        if isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def check_name(self, node: ast.AST, name: str) -> None:
        """A module or object reached by its qualified name."""
        if name.startswith("builtins.") and not self._imported_builtins():
            return  # a bare builtin: exec and friends are judged at their call
        for key, fix in RULES.items():
            if name == key or name.startswith(key + "."):
                self.flag(node, key, fix)
                return
        parts = name.split(".")
        if parts[0] == "infracourse" and len(parts) > 1 and parts[1] not in ENGINE_PUBLIC:
            self.flag(node, ".".join(parts[:2]), _ENGINE)
        elif parts[0] in NATIVE_MODULES and not self.native_code:
            self.flag(node, parts[0], _NATIVE)
        elif parts[0] in PRIVATE_OWNERS and any(p.startswith("_") and not p.startswith("__") for p in parts[1:]) \
                and not PRIVATE_PUBLISHED.match(name):
            self.flag(node, name, _PRIVATE)

    def _imported_builtins(self) -> bool:
        return any(v == "builtins" or v.startswith("builtins.") for v in self.aliases.values())

    # ---------------------------------------------------------------- imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_name(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return  # a module of the learner's own package
        self.check_name(node, node.module)
        for alias in node.names:
            self.check_name(node, f"{node.module}.{alias.name}")

    # ---------------------------------------------------------------- names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.aliases:
            self.check_name(node, self.aliases[node.id])
        elif node.id == "__builtins__":
            self.flag(node, "__builtins__", _PATCH)
        elif node.id in CODE_BUILTINS | REFLECTION and node.id not in self.defined and isinstance(node.ctx, ast.Load) \
                and not getattr(node, "_called", False):
            self.flag(node, node.id, _HIDDEN)  # exec passed around as a value: its argument cannot be read

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in FRAME_ATTRIBUTES:
            self.flag(node, node.attr, _FRAMES)
        elif node.attr in CODE_DUNDERS:
            self.flag(node, node.attr, _DUNDER)
        name = self.qualified(node)
        if name:
            self.check_name(node, name)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            if _PROC_MEMORY.search(node.value):
                self.flag(node, node.value[:40], _MEMORY)
            elif _PROC_FDS.search(node.value):
                self.flag(node, node.value[:40], _CHANNEL)
            elif node.value == "__main__" and not getattr(node, "_name_test", False):
                self.flag(node, "'__main__'", _MAIN)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        if "/proc/" in text and "mem" in text:
            self.flag(node, "/proc/.../mem", _MEMORY)
        elif "/proc/" in text and "fd" in text:
            self.flag(node, "/proc/.../fd", _CHANNEL)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        if any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides):
            for side in sides:
                side._name_test = True  # `if __name__ == "__main__":` runs a script, it reaches nothing
        self.generic_visit(node)

    # ---------------------------------------------------------------- calls and assignments
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            func._called = True
        name = self.qualified(func)
        literal = bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
        if name in ("builtins.exec", "builtins.eval", "builtins.compile") and not literal:
            self.flag(node, f"{name[9:]}() of a computed string", _HIDDEN)
        elif name in ("builtins.__import__", "importlib.import_module"):
            if literal:
                self.check_name(node, node.args[0].value)
            else:
                self.flag(node, f"{name.rsplit('.', 1)[1]}() of a computed name", _IMPORTS)
        elif name in ("builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.vars") and node.args:
            self.reflective(node, name[9:])
        elif name in ("operator.attrgetter", "operator.methodcaller") and not literal:
            self.flag(node, f"{name}() of a computed name", _HIDDEN)
        elif name == "operator.attrgetter":
            for attribute in node.args[0].value.split("."):
                if attribute in FRAME_ATTRIBUTES or attribute in CODE_DUNDERS:
                    self.flag(node, f"attrgetter({attribute!r})", _DUNDER)
        elif name == "signal.signal" and not (node.args and self.qualified(node.args[0]) in
                                              tuple(f"signal.{s}" for s in STOP_SIGNALS)):
            self.flag(node, "signal.signal() of a signal other than SIGTERM or SIGINT", _SIGNALS)
        elif isinstance(func, ast.Attribute) and func.attr in ("update", "setdefault", "pop", "clear", "__setitem__") \
                and isinstance(func.value, ast.Attribute) and func.value.attr == "__dict__":
            self.flag(node, f"__dict__.{func.attr}()", _PATCH)
        elif name in ("builtins.object.__setattr__", "builtins.type.__setattr__") and node.args and not (
                isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls")):
            self.flag(node, f"{name[9:]} on another object", _PATCH)
        self.generic_visit(node)

    def reflective(self, node: ast.Call, function: str) -> None:
        """getattr/setattr/delattr/vars. By a literal name they are an attribute access. On a module, a class the
        file did not define or an object's type, a computed name, and any change, are not allowed; elsewhere a
        name built in the call (concatenated, formatted) is not either, since it hides what is reached."""
        target, rest = node.args[0], node.args[1:]
        owner = self.qualified(target)
        foreign = owner is not None and not owner.startswith("builtins.") or self._type_of(target)
        if rest and isinstance(rest[0], ast.Constant) and isinstance(rest[0].value, str):
            attribute = rest[0].value
            if attribute in FRAME_ATTRIBUTES or attribute in CODE_DUNDERS:
                self.flag(node, f"{function}(..., {attribute!r})", _DUNDER)
            if owner:
                self.check_name(node, f"{owner}.{attribute}")
            if function != "getattr" and foreign:
                self.flag(node, f"{function}() on {owner or 'a type'}", _PATCH)
        elif foreign:
            self.flag(node, f"{function}() of a computed attribute of {owner or 'a type'}", _PATCH)
        elif rest and isinstance(rest[0], (ast.BinOp, ast.JoinedStr, ast.Call)):
            self.flag(node, f"{function}() of an attribute name built at run time", _HIDDEN)

    def _type_of(self, node: ast.AST) -> bool:
        """type(x) or x.__class__: changing it changes every object of that class, the grader's included."""
        return isinstance(node, ast.Call) and self.qualified(node.func) == "builtins.type" or \
            isinstance(node, ast.Attribute) and node.attr == "__class__"

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.assigned(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.assigned(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.assigned(target)
        self.generic_visit(node)

    def assigned(self, target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.assigned(element)
            return
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute) \
                and target.value.attr == "__dict__":
            self.flag(target, "a write into __dict__", _PATCH)
        if not isinstance(target, ast.Attribute):
            return
        if target.attr in ("__class__", "__bases__", "__dict__"):
            self.flag(target, f"assigning {target.attr}", _PATCH)
        owner = self.qualified(target.value)
        if owner and not owner.startswith("builtins.") and not f"{owner}.".startswith(SETTINGS) or \
                owner and owner.startswith("builtins.") and self._imported_builtins() or self._type_of(target.value):
            self.flag(target, f"assigning {owner or 'an attribute of a type'}.{target.attr}", _PATCH)
