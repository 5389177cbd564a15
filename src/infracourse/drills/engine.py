"""One drill question, made concrete and graded: draw its parameters from a seed, compute the answer by its
formula, read the learner's reply, and say what was right, what was wrong and how it is worked out.

The same (question, seed) always gives the same instance, so a result can be replayed and checked; a new
seed gives fresh numbers, so an estimate is practised rather than remembered.
"""
from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass, field, replace

from infracourse.drills import answers, formula
from infracourse.drills.content import Question

LETTERS = string.ascii_lowercase


class Unavailable(Exception):
    """A measured question whose figure this learner has not recorded yet (the message says which grade)."""


class Num(float):
    """A number as a prompt shows it: 4096 not 4096.0, 0.3333 not 0.3333333333333333; a format spec
    (`{x:,.0f}`) still applies."""

    def __format__(self, spec: str) -> str:
        if spec:
            return format(float(self), spec)
        if float(self).is_integer() and abs(self) < 1e15:
            return str(int(self))
        return f"{float(self):.4g}"


@dataclass
class Instance:
    question: Question
    seed: int
    values: dict[str, float | str] = field(default_factory=dict)  # every parameter and derived value
    prompt: str = ""
    expected: float | None = None  # numeric kinds, in question.unit
    order: list[int] = field(default_factory=list)  # choice kinds: the option shown as letter i is options[order[i]]

    @property
    def shown_options(self) -> list[str]:
        return [self.question.options[i] for i in self.order]

    def as_dict(self) -> dict:
        """What a tool needs to show the question (not its answer)."""
        q = self.question
        data = {"id": q.id, "seed": self.seed, "week": q.week, "topic": q.topic, "kind": q.kind, "prompt": self.prompt}
        if q.numeric:
            data |= {"unit": q.unit, "tolerance": q.tolerance}
        else:
            data["options"] = {LETTERS[i]: text for i, text in enumerate(self.shown_options)}
        return data


@dataclass(frozen=True)
class Outcome:
    correct: bool
    why: str  # what was wrong ('' when right)
    expected: str  # the right answer as shown
    explanation: str  # the working and the reasoning, shown after every answer

    def as_dict(self) -> dict:
        return {"correct": self.correct, "why": self.why, "expected": self.expected, "explanation": self.explanation}


def instantiate(question: Question, seed: int, figures: dict[str, float] | None = None) -> Instance:
    """The question with parameters drawn from `seed`; `figures` holds the measured ones (by name)."""
    rng = random.Random(f"{question.id}:{seed}")
    inst = Instance(question, seed)
    for name, param in question.params.items():
        drawn = _draw(param, rng)
        inst.values |= {k: _num(v) for k, v in drawn.items()} if isinstance(drawn, dict) else {name: _num(drawn)}
    for name, spec in question.measured.items():
        if figures is None or name not in figures:
            raise Unavailable(f"{question.id} needs {spec.week}'s figure {spec.figure!r} ({spec.check}): grade "
                              f"{spec.week} on hardware that runs that check")
        inst.values[name] = Num(figures[name])
    numbers = {k: v for k, v in inst.values.items() if isinstance(v, float)}
    for name, text in question.let.items():
        numbers[name] = inst.values[name] = Num(formula.evaluate(text, numbers))
    if question.numeric:
        inst.expected = float(formula.evaluate(question.answer, numbers))
        if not math.isfinite(inst.expected):
            raise ValueError(f"{question.id} seed {seed}: the answer is not a finite number")
    else:
        inst.order = list(range(len(question.options)))
        rng.shuffle(inst.order)
    inst.prompt = fill(question.prompt, inst)
    return inst


def _draw(param, rng: random.Random):
    if param.choices is not None:
        return rng.choice(param.choices)
    if param.pow2 is not None:
        return 2 ** rng.randint(*param.pow2)
    low, high = param.range
    if param.step:
        return low + param.step * rng.randint(0, int(round((high - low) / param.step)))
    return round(rng.uniform(low, high), 3)


def _num(value):
    return value if isinstance(value, str) else Num(value)


def fill(template: str, inst: Instance, extra: dict | None = None) -> str:
    try:
        return flow(template).format_map({**inst.values, **(extra or {})})
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"question {inst.question.id}: its text names {exc} that no parameter defines") from None


def reveal(inst: Instance, why: str = "") -> Outcome:
    """The right answer and its working, as shown after an answer (or when the learner skips)."""
    q = inst.question
    if not q.numeric:
        return Outcome(False, why, _right_letters(inst), flow(q.explain))
    shown = answers.human(inst.expected, q.unit)
    working = fill(q.working, inst, {"answer": Num(inst.expected), "answer_h": shown})
    return Outcome(False, why, f"{shown} (±{tolerance(q)})", f"{working}\n{flow(q.explain)}")


def tolerance(q: Question) -> str:
    """The stated tolerance: 5 %, 0.5 %, 0.1 %."""
    return f"{q.tolerance * 100:.2g} %"


def check(inst: Instance, reply: str) -> Outcome:
    """Grade one reply. A reply that cannot be read raises answers.AnswerError (ask again, nothing recorded)."""
    q = inst.question
    if q.numeric:
        got = answers.parse(reply, q.unit)
        numbers = {k: v for k, v in inst.values.items() if isinstance(v, float)}
        mistakes = {m.say: float(formula.evaluate(m.formula, numbers)) for m in q.mistakes}
        verdict = answers.judge(got, inst.expected, q.tolerance, mistakes)
        why = verdict.why and f"you said {answers.human(got, q.unit)}; {verdict.why}"
        return replace(reveal(inst, why), correct=verdict.correct)
    picked = _letters(reply, len(q.options), ordered=q.kind == "order")
    chosen = [inst.order[i] for i in picked]
    if q.kind == "order":
        correct = chosen == list(range(len(q.options)))
        placed = sum(a == b for a, b in zip(chosen, range(len(q.options))))
        why = "" if correct else f"{placed} of {len(q.options)} in the right place"
    else:
        correct = sorted(chosen) == sorted(q.correct)
        missed = len(set(q.correct) - set(chosen))
        extra = len(set(chosen) - set(q.correct))
        why = "" if correct else ", ".join(p for p in (f"{missed} right option(s) missed" if missed else "",
                                                        f"{extra} wrong option(s) picked" if extra else "") if p)
    return replace(reveal(inst, why), correct=correct)


def flow(text: str) -> str:
    """YAML block text as prose: the lines of a paragraph joined, paragraphs kept apart (the terminal wraps)."""
    return "\n".join(" ".join(p.split()) for p in text.strip().split("\n\n"))


def _right_letters(inst: Instance) -> str:
    q = inst.question
    if q.kind == "order":
        return " ".join(LETTERS[inst.order.index(i)] for i in range(len(q.options)))
    return ", ".join(sorted(LETTERS[inst.order.index(i)] for i in q.correct))


def _letters(reply: str, count: int, ordered: bool) -> list[int]:
    typed = [c for c in reply.lower() if c.isalpha()]
    valid = LETTERS[:count]
    if not typed or any(c not in valid for c in typed):
        raise answers.AnswerError(f"type the letter{'s in order' if ordered else '(s)'} of your answer, "
                                  f"from {valid[0]} to {valid[-1]} (e.g. {'c a b' if ordered else 'b'})")
    if len(set(typed)) != len(typed):
        raise answers.AnswerError("each letter once, please")
    if ordered and len(typed) != count:
        raise answers.AnswerError(f"put all {count} letters in order")
    return [valid.index(c) for c in typed]


def new_seed() -> int:
    return random.SystemRandom().randrange(1, 10 ** 6)
