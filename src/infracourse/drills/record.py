"""A learner's drill record as it travels to the instructor: the `drills.json` member of a submit bundle, and
the cohort's per-topic accuracy the gradebook and the published site show.

`drills.json` (format_version 1) holds the learner's totals over every drill answer recorded so far (sittings
and mock screens; the start self-test aside), per topic: `{"format_version": 1, "answered": N, "right": R,
"by_topic": {"kv-cache": {"right": 3, "answered": 4}, ...}}`. It is listed, hashed and signed in the
manifest like every other member. Totals only: no replies, no timings, no question ids (what a learner typed
stays on their machine). Bundles written before the member existed have none; they read as "no record".

The record is self-reported practice, so it counts nowhere in a grade; `parse` still refuses anything that is
not exactly this shape (a count that is not a whole number, more right than answered, totals that do not add
up, a topic name that is not a course slug), so what the site shows is well formed.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable

FILE = "drills.json"
FORMAT_VERSION = 1
MAX_TOPICS = 200
TOPIC = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


class RecordError(ValueError):
    """drills.json is not a drill record; the message says which field and how."""


def summary(history: list[dict]) -> dict:
    """The record of a learner's drill history (`Progress.drill_history()`, oldest first)."""
    by_topic: dict[str, dict[str, int]] = {}
    for row in history:
        score = by_topic.setdefault(row["topic"], {"right": 0, "answered": 0})
        score["right"] += bool(row["correct"])
        score["answered"] += 1
    return {"format_version": FORMAT_VERSION, "answered": len(history),
            "right": sum(s["right"] for s in by_topic.values()), "by_topic": dict(sorted(by_topic.items()))}


def encode(record: dict) -> bytes:
    return json.dumps(record, indent=1, sort_keys=True).encode()


def parse(data: bytes) -> dict:
    """The record in `data`, checked field by field; RecordError names the first fault."""
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise RecordError(f"a JSON {type(record).__name__}, not an object")
    expected = {"format_version", "answered", "right", "by_topic"}
    if set(record) != expected:
        missing, extra = sorted(expected - set(record)), sorted(set(record) - expected)
        raise RecordError(", ".join(p for p in (f"missing {missing}" if missing else "",
                                                f"unknown field(s) {extra}" if extra else "") if p))
    if record["format_version"] != FORMAT_VERSION or isinstance(record["format_version"], bool):
        raise RecordError(f"format_version {record['format_version']!r}; this infracourse reads {FORMAT_VERSION}")
    topics = record["by_topic"]
    if not isinstance(topics, dict) or len(topics) > MAX_TOPICS:
        raise RecordError(f"by_topic must be an object of at most {MAX_TOPICS} topics")
    for topic, score in topics.items():
        if not TOPIC.match(topic):
            raise RecordError(f"topic {topic[:70]!r} is not a topic name (lowercase letters, digits and -)")
        if not isinstance(score, dict) or set(score) != {"right", "answered"}:
            raise RecordError(f"by_topic.{topic} must be {{\"right\": R, \"answered\": N}}")
        _count(score["answered"], f"by_topic.{topic}.answered")
        _count(score["right"], f"by_topic.{topic}.right")
        if score["right"] > score["answered"]:
            raise RecordError(f"by_topic.{topic}: {score['right']} right out of {score['answered']} answered")
    for total in ("answered", "right"):
        _count(record[total], total)
        if record[total] != sum(s[total] for s in topics.values()):
            raise RecordError(f"{total} is {record[total]} but the topics add up to "
                              f"{sum(s[total] for s in topics.values())}")
    return record


def _count(value, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10 ** 9:
        raise RecordError(f"{where} is {value!r}, not a whole number from 0 up")


def cohort(records: Iterable[tuple[str, dict]]) -> dict:
    """Per-topic accuracy across the cohort from each learner's newest record ((learner, record) pairs):
    {"learners": n, "answered": N, "right": R, "by_topic": {topic: {"learners", "answered", "right",
    "accuracy"}}}, accuracy pooled over every answer (None where nothing was answered)."""
    by_topic: dict[str, dict] = {}
    learners = answered = right = 0
    for _learner, record in records:
        learners += 1
        answered += record["answered"]
        right += record["right"]
        for topic, score in record["by_topic"].items():
            row = by_topic.setdefault(topic, {"learners": 0, "answered": 0, "right": 0})
            row["learners"] += score["answered"] > 0
            row["answered"] += score["answered"]
            row["right"] += score["right"]
    for row in by_topic.values():
        row["accuracy"] = row["right"] / row["answered"] if row["answered"] else None
    return {"learners": learners, "answered": answered, "right": right,
            "accuracy": right / answered if answered else None, "by_topic": dict(sorted(by_topic.items()))}
