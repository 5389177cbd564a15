"""Reading what a learner types as a number, and saying precisely how a wrong one is wrong.

An answer is a number with an optional unit: `2.5e9`, `2_500_000_000`, `2,500,000,000`, `2.5 GB`, `2.5GiB`,
`3x`, `45%`, `$1.20`, `850 us`. A bare number is read in the question's own unit; a typed unit must measure
the same thing (a size, a time, a rate...) and is converted: `2.5 GB` and `2.33 GiB` are the same answer.
A wrong answer is compared with the right one: a factor of 2 (K and V, read and write), of 8 (bits and
bytes), a power of ten (a unit prefix), 1.024^k (GB against GiB), or a known mistake of that question.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

# unit -> (what it measures, its size in that dimension's base unit)
UNITS: dict[str, tuple[str, float]] = {}


def _family(dimension: str, base: str, factors: dict[str, float]) -> None:
    for prefix, factor in factors.items():
        UNITS[f"{prefix}{base}"] = (dimension, factor)


_SI = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50}
_family("size", "B", {**_SI, **_BINARY})
_family("time", "s", {"": 1.0, "m": 1e-3, "u": 1e-6, "µ": 1e-6, "n": 1e-9})
UNITS.update({"min": ("time", 60.0), "h": ("time", 3600.0)})
_family("work", "FLOP", _SI)
_family("compute rate", "FLOP/s", _SI)
_family("compute rate", "FLOPS", _SI)
_family("bandwidth", "B/s", {**_SI, **_BINARY})
_family("intensity", "FLOP/B", {"": 1.0})
_family("token rate", "tok/s", {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6})
_family("request rate", "req/s", {"": 1.0, "k": 1e3, "K": 1e3})
_family("tokens", "tok", {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9})
_family("parameters", "params", {"": 1.0, "M": 1e6, "G": 1e9})
UNITS.update({"x": ("ratio", 1.0), "%": ("ratio", 0.01), "ratio": ("ratio", 1.0),
              "$": ("money", 1.0), "USD": ("money", 1.0), "GPUs": ("count", 1.0), "count": ("count", 1.0),
              "requests": ("count", 1.0), "steps": ("count", 1.0)})
ALIASES = {"bytes": "B", "byte": "B", "tokens/s": "tok/s", "token/s": "tok/s", "tokens": "tok", "flop": "FLOP",
           "flops": "FLOP", "times": "x", "×": "x", "us": "us", "sec": "s", "ms": "ms", "gpus": "GPUs",
           "gpu": "GPUs", "usd": "$", "flop/byte": "FLOP/B", "flops/byte": "FLOP/B", "flop/b": "FLOP/B",
           "req": "requests", "rps": "req/s", "tflops": "TFLOP/s", "gflops": "GFLOP/s", "pflops": "PFLOP/s"}
NUMBER = re.compile(r"^\s*(\$)?\s*([-+]?(?:\d[\d_,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")
BASE_NAMES = {"size": "B (or KB, MB, GB, GiB...)", "time": "s (or ms, us)", "compute rate": "FLOP/s (or TFLOP/s)",
              "bandwidth": "B/s (or GB/s, TB/s)", "ratio": "x (or %)", "money": "$", "work": "FLOP (or TFLOP)"}


class AnswerError(ValueError):
    """What was typed is not a number in a unit this question accepts; the message says what to type."""


def lookup(unit: str) -> tuple[str, float]:
    """(dimension, factor) of a unit name as a course file or a learner writes it."""
    key = unit.strip()
    key = ALIASES.get(key, ALIASES.get(key.lower(), key))
    if key in UNITS:
        return UNITS[key]
    if key.endswith("FLOPS") and key[:-5] in _SI:
        return UNITS[key[:-5] + "FLOP/s"]
    raise AnswerError(f"unknown unit {unit!r}")


def parse(text: str, unit: str) -> float:
    """The value typed, in `unit` (the question's unit)."""
    dimension, factor = lookup(unit)
    match = NUMBER.match(text.replace("−", "-"))
    if not match or (text.count(",") and not re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d*)?", match.group(2))):
        raise AnswerError(f"{text.strip()!r} is not a number: type e.g. 2.5e9, 2.5 GB or 3x")
    dollar, number, typed = match.groups()
    value = float(number.replace("_", "").replace(",", ""))
    typed = "$" if dollar and not typed else typed
    if not typed:
        return value
    try:
        got_dimension, got_factor = lookup(typed)
    except AnswerError:
        raise AnswerError(f"unknown unit {typed!r}: this answer is a {dimension}, in {BASE_NAMES.get(dimension, unit)}"
                          ) from None
    if got_dimension != dimension:
        raise AnswerError(f"{typed!r} measures {got_dimension}; this answer is a {dimension}, in "
                          f"{BASE_NAMES.get(dimension, unit)}")
    return value * got_factor / factor


@dataclass(frozen=True)
class Verdict:
    correct: bool
    got: float
    expected: float
    why: str  # empty when correct: otherwise how the answer differs from the right one


def judge(got: float, expected: float, tolerance: float, mistakes: dict[str, float] | None = None) -> Verdict:
    """Right within a relative tolerance; otherwise the likeliest reason. `mistakes`: message -> the value
    a known wrong working gives (checked first: it names the step that was missed)."""
    def near(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=tolerance, abs_tol=1e-12)

    if near(got, expected):
        return Verdict(True, got, expected, "")
    for message, value in (mistakes or {}).items():
        if near(got, value):
            return Verdict(False, got, expected, message)
    if got == 0 or expected == 0 or (got < 0) != (expected < 0):
        return Verdict(False, got, expected, "a different sign or zero: recheck what is being asked")
    ratio = got / expected
    for factor, reason in ((2, "a missing or extra factor of 2 (K and V? read and write? forward and backward?)"),
                           (8, "a factor of 8: bits against bytes"), (4, "a factor of 4: check the bytes per element "
                                                                            "(fp32 4, bf16 2, int8 1)")):
        if near(ratio, factor) or near(ratio, 1 / factor):
            return Verdict(False, got, expected, f"{_times(ratio)} the answer: {reason}")
    for k in range(1, 5):
        if near(ratio, 1.024 ** k) or near(ratio, 1.024 ** -k):
            return Verdict(False, got, expected, f"{_times(ratio)} the answer: decimal against binary units "
                           f"(GB is 1e9 bytes, GiB 2^30)")
    power = round(math.log10(abs(ratio)))
    if power and near(ratio, 10.0 ** power):
        return Verdict(False, got, expected, f"off by 10^{power}: the digits are right, check the unit prefix "
                                             "or a power of ten")
    return Verdict(False, got, expected, f"{_times(ratio)} the answer, outside the ±{tolerance * 100:.2g} % allowed")


def _times(ratio: float) -> str:
    return f"{ratio:.3g}x" if ratio >= 1 else f"1/{1 / ratio:.3g} of"


def human(value: float, unit: str) -> str:
    """A value in the unit family that reads best: 1.6e10 B -> '16 GB', 3.2e-4 s -> '320 us'."""
    dimension, factor = lookup(unit)
    base = value * factor
    best = {"size": [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1)],
            "time": [("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)],
            "compute rate": [("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("FLOP/s", 1)],
            "work": [("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("FLOP", 1)],
            "bandwidth": [("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("B/s", 1)]}.get(dimension)
    if best:
        name, size = next(((n, s) for n, s in best if abs(base) >= s), best[-1])
        return f"{base / size:.4g} {name}"
    if dimension in ("count", "tokens", "parameters") and float(value).is_integer():
        return f"{value:,.0f}" + ("" if dimension == "count" else f" {unit}")
    if unit == "%":
        return f"{value:.4g} %"
    if unit == "$":
        return f"${value:,.4g}" if abs(value) < 1e4 else f"${value:,.0f}"
    return f"{value:.4g} {unit}".rstrip()
