"""A sitting: choose the questions, ask them one by one, record each answer as it is given (a Ctrl-C keeps
the answers before it), and sum up per topic. Input and output are functions, so tests and tools drive the
same loop the terminal does.

Replies: a number (with or without a unit), letters for choices; `skip` shows the answer (counted wrong);
`quit` ends the sitting. A reply that cannot be read is explained and asked again, never counted.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable

from infracourse.drills import engine, measured, schedule
from infracourse.drills.answers import AnswerError
from infracourse.drills.content import Question
from infracourse.drills.engine import Instance, Outcome

MOCK_QUESTIONS, MOCK_MINUTES = 12, 20  # a technical screen's length


@dataclass
class Answered:
    instance: Instance
    outcome: Outcome
    reply: str
    seconds: float


@dataclass
class Sitting:
    answered: list[Answered] = field(default_factory=list)
    unanswered: list[Instance] = field(default_factory=list)  # time ran out or the learner quit

    def by_topic(self) -> dict[str, list[int]]:
        """topic -> [right, asked]; questions left unanswered count as asked."""
        return self.tally(lambda question: question.topic)

    def tally(self, key) -> dict[str, list[int]]:
        """key(question) -> [right, asked], in key order; questions left unanswered count as asked."""
        score: dict[str, list[int]] = {}
        for a in self.answered:
            score.setdefault(key(a.instance.question), [0, 0])[0] += a.outcome.correct
            score[key(a.instance.question)][1] += 1
        for inst in self.unanswered:
            score.setdefault(key(inst.question), [0, 0])[1] += 1
        return dict(sorted(score.items()))

    def as_dict(self) -> dict:
        return {"right": sum(a.outcome.correct for a in self.answered),
                "asked": len(self.answered) + len(self.unanswered), "by_topic": self.by_topic(),
                "answers": [{**a.instance.as_dict(), **a.outcome.as_dict(), "reply": a.reply,
                             "seconds": round(a.seconds, 1)} for a in self.answered],
                "unanswered": [i.question.id for i in self.unanswered]}


def choose(questions: list[Question], history: list[dict], last_grade, *, weeks: set[str] | None, count: int,
           mock: bool, seed: int, only: str | None = None) -> list[Instance]:
    """The instances of one sitting. Measured questions come in only where the learner has the figures."""
    pool = [q for q in questions if (weeks is None or q.week in weeks) and (only is None or q.id == only)]
    if only and not pool:
        raise KeyError(f"no drill question {only!r}" + (" in the weeks you have unlocked" if questions else ""))
    found = {q.id: measured.figures(q, last_grade) for q in pool if q.kind == "measured"}
    pool = [q for q in pool if q.kind != "measured" or found[q.id] is not None]
    rng = random.Random(seed)
    picked = schedule.mixed(pool, count, rng) if mock else schedule.pick(pool, history, count, rng)
    return [engine.instantiate(q, seed, found.get(q.id)) for q in picked]


def ask_all(instances: list[Instance], ask: Callable[[str], str], say: Callable[[str], None], *,
            on_answer: Callable[[Answered], None] = lambda _a: None, deadline: float | None = None,
            clock: Callable[[], float] = time.monotonic) -> Sitting:
    sitting = Sitting()
    for number, inst in enumerate(instances, 1):
        if deadline is not None and clock() >= deadline:
            say("time is up")
            sitting.unanswered += instances[number - 1:]
            break
        say(render(inst, number, len(instances)))
        started = clock()
        answered = _one(inst, ask, say)
        if answered is None:
            sitting.unanswered += instances[number - 1:]
            break
        outcome, reply = answered
        done = Answered(inst, outcome, reply, clock() - started)
        sitting.answered.append(done)
        on_answer(done)
        say(explain(outcome))
    return sitting


def _one(inst: Instance, ask, say) -> tuple[Outcome, str] | None:
    while True:
        try:
            reply = ask("> ").strip()
        except EOFError:
            return None
        if reply.lower() in ("quit", "q", "exit"):
            return None
        if reply.lower() in ("skip", "?"):
            return engine.reveal(inst, "skipped"), reply
        if not reply:
            continue
        try:
            return engine.check(inst, reply), reply
        except AnswerError as exc:
            say(f"  {exc}")


def render(inst: Instance, number: int, total: int) -> str:
    q = inst.question
    head = f"[{number}/{total}] {q.week} · {q.topic} · {q.kind}"
    lines = [head, inst.prompt]
    if q.numeric:
        lines.append(f"(a bare number is read in {q.unit}; a unit of the same kind is converted; within "
                     f"±{engine.tolerance(q)}; `skip` shows the answer)")
    else:
        lines += [f"  {engine.LETTERS[i]}) {text}" for i, text in enumerate(inst.shown_options)]
        lines.append({"choice": "(one letter)", "multi": "(every right letter, e.g. a c)",
                      "order": "(all the letters, in order)"}[q.kind])
    return "\n".join(lines)


def explain(outcome: Outcome) -> str:
    verdict = "right" if outcome.correct else f"not quite: {outcome.why}" if outcome.why else "not quite"
    return f"{verdict} — answer: {outcome.expected}\n{outcome.explanation}\n"


def seed_from(given: int | None) -> int:
    return given if given is not None else engine.new_seed()


def by_topic(history: list[dict]) -> dict[str, list[int]]:
    """topic -> [right, answered] over every drill answer recorded (the self-test aside)."""
    score: dict[str, list[int]] = {}
    for row in history:
        score.setdefault(row["topic"], [0, 0])[0] += row["correct"]
        score[row["topic"]][1] += 1
    return dict(sorted(score.items()))


def history_line(history: list[dict]) -> str:
    """One line for `status`: how the drills went, and the weakest topic."""
    if not history:
        return "drills: none yet — `infracourse drill` practises the estimates and concepts of your unlocked weeks"
    scores = by_topic(history)
    right = sum(r for r, _ in scores.values())
    weakest = min(scores.items(), key=lambda item: (item[1][0] / item[1][1], -item[1][1]))
    return (f"drills: {right}/{len(history)} right over {len(scores)} topics; weakest {weakest[0]} "
            f"({weakest[1][0]}/{weakest[1][1]}) — `infracourse drill` brings misses back first")
