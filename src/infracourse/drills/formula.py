"""The arithmetic a drill's YAML may write: numbers, parameter names, + - * / // % **, comparisons inside
`if_(cond, a, b)`, and a few functions (ceil, floor, log2, sqrt, min, max, round).

Formulas are course content, not learner input, but they are still read with an AST walk rather than eval():
a typo (`laers`) or a construct outside this list is refused with the formula and the name, when the course
loads, instead of surfacing as a wrong answer in front of a learner.
"""
from __future__ import annotations

import ast
import math
import operator

FUNCTIONS = {"ceil": math.ceil, "floor": math.floor, "log2": math.log2, "log10": math.log10, "sqrt": math.sqrt,
             "min": min, "max": max, "round": round, "abs": abs, "if_": lambda cond, a, b: a if cond else b}
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}


class FormulaError(ValueError):
    """A formula uses a name or construct this evaluator does not know; the message quotes it."""


def parse(text: str) -> ast.Expression:
    try:
        tree = ast.parse(str(text).strip(), mode="eval")
    except SyntaxError as exc:
        raise FormulaError(f"formula {text!r} is not arithmetic: {exc.msg}") from None
    for node in ast.walk(tree):
        allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Constant, ast.Name, ast.Load,
                   ast.Call, ast.Compare, *BINARY, *COMPARE)
        if not isinstance(node, allowed):
            raise FormulaError(f"formula {text!r}: {type(node).__name__} is not allowed (arithmetic, names and "
                               f"{', '.join(FUNCTIONS)} only)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise FormulaError(f"formula {text!r}: {node.value!r} is not a number")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
            raise FormulaError(f"formula {text!r}: only {', '.join(FUNCTIONS)} may be called")
    return tree


def names(text: str) -> set[str]:
    """The parameter names a formula reads (function names left out)."""
    calls = {n.func.id for n in ast.walk(parse(text)) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(parse(text)) if isinstance(n, ast.Name)} - calls


def evaluate(text: str, values: dict[str, float]) -> float:
    """The formula's value for these parameters; a name it lacks is a FormulaError naming it."""
    return _eval(parse(text).body, values, text)


def _eval(node: ast.AST, values: dict[str, float], text: str):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise FormulaError(f"formula {text!r}: no parameter {node.id!r} (known: {', '.join(sorted(values))})")
        return values[node.id]
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, values, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        return BINARY[type(node.op)](_eval(node.left, values, text), _eval(node.right, values, text))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values, text)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, values, text)
            if not COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return FUNCTIONS[node.func.id](*(_eval(a, values, text) for a in node.args))
    raise FormulaError(f"formula {text!r}: cannot evaluate {type(node).__name__}")  # parse() refused it already
