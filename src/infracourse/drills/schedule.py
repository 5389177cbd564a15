"""Which questions come next: spaced repetition over the learner's drill history (Leitner boxes).

Each right answer moves a question up a box and pushes its next showing further out (INTERVALS_DAYS); a wrong
one drops it to box 0, due at once. A set is filled in this order: questions last answered wrong (oldest
first), questions never seen, questions due, and only then questions not due yet (least recently seen first).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from infracourse.drills.content import Question

INTERVALS_DAYS = (0, 1, 3, 7, 14, 30)  # by box


@dataclass
class Card:
    box: int = 0
    seen: int = 0
    last_wrong: bool = False
    last_at: float = 0.0  # epoch seconds of the last answer

    def due_at(self) -> float:
        return self.last_at + INTERVALS_DAYS[self.box] * 86400


def cards(history: list[dict]) -> dict[str, Card]:
    """Each question's box from its answers, oldest first."""
    deck: dict[str, Card] = {}
    for row in history:
        card = deck.setdefault(row["question"], Card())
        card.box = min(card.box + 1, len(INTERVALS_DAYS) - 1) if row["correct"] else 0
        card.seen += 1
        card.last_wrong = not row["correct"]
        card.last_at = time.mktime(time.strptime(row["answered_at"], "%Y-%m-%dT%H:%M:%S"))
    return deck


def pick(questions: list[Question], history: list[dict], count: int, rng: random.Random,
         now: float | None = None) -> list[Question]:
    now = time.time() if now is None else now
    deck = cards(history)
    fresh = [q for q in questions if q.id not in deck]
    rng.shuffle(fresh)
    fresh.sort(key=lambda q: q.week)  # earlier weeks first, shuffled within a week
    seen = [q for q in questions if q.id in deck]
    wrong = sorted((q for q in seen if deck[q.id].last_wrong), key=lambda q: deck[q.id].last_at)
    due = sorted((q for q in seen if not deck[q.id].last_wrong and deck[q.id].due_at() <= now),
                 key=lambda q: deck[q.id].due_at())
    later = sorted((q for q in seen if not deck[q.id].last_wrong and deck[q.id].due_at() > now),
                   key=lambda q: deck[q.id].last_at)
    return (wrong + fresh + due + later)[:count]


def mixed(questions: list[Question], count: int, rng: random.Random) -> list[Question]:
    """A mock screen's set: spread over topics (round-robin over shuffled topics), numbers and concepts mixed."""
    by_topic: dict[str, list[Question]] = {}
    for q in rng.sample(questions, len(questions)):
        by_topic.setdefault(q.topic, []).append(q)
    topics = list(by_topic)
    rng.shuffle(topics)
    chosen: list[Question] = []
    while len(chosen) < count and any(by_topic.values()):
        for topic in topics:
            if by_topic[topic] and len(chosen) < count:
                chosen.append(by_topic[topic].pop())
    return chosen
