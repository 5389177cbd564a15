"""The drills engine: answers read with units and wrong ones explained, instances reproducible from a seed,
spaced repetition, the asking loop, the self-test's suggestion, progress records and the two commands."""
from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from infracourse.cli import app
from infracourse.course import Course
from infracourse.drills import answers, audit, content, engine, schedule, selftest, session
from infracourse.progress import Progress


@pytest.fixture(scope="module")
def questions():
    return {q.id: q for q in content.load(Course().root)}


def test_course_has_150_questions_over_24_weeks_and_audits_clean(questions):
    weeks = {q.week for q in questions.values()}
    assert len(questions) >= 150 and weeks == {f"week{n:02d}" for n in range(1, 25)}
    assert set(content.TOPICS) == {q.topic for q in questions.values()}
    assert audit.problems(Course()) == []


@pytest.mark.parametrize("typed, unit, value", [
    ("2.5e9", "B", 2.5e9), ("2.5 GB", "B", 2.5e9), ("2.5GiB", "B", 2.5 * 2 ** 30), ("2,500,000,000", "B", 2.5e9),
    ("3x", "x", 3.0), ("45%", "x", 0.45), ("45", "%", 45.0), ("850 us", "ms", 0.85), ("$1.20", "$", 1.2),
    ("2 TFLOPS", "TFLOP/s", 2.0), ("1_000", "count", 1000.0)])
def test_answers_read_as_people_type_them(typed, unit, value):
    assert answers.parse(typed, unit) == pytest.approx(value)


@pytest.mark.parametrize("typed, unit, says", [("3 ms", "B", "measures time"), ("2.5 GQ", "B", "unknown unit"),
                                               ("lots", "B", "not a number"), ("1,00", "B", "not a number")])
def test_unreadable_answers_say_what_to_type(typed, unit, says):
    with pytest.raises(answers.AnswerError, match=says):
        answers.parse(typed, unit)


@pytest.mark.parametrize("got, says", [(0.5, "factor of 2"), (8.0, "bits against bytes"), (100.0, "10^2"),
                                       (1.0 / 1.024 ** 3, "GiB"), (1.7, "outside the ±3 %")])
def test_a_wrong_answer_is_told_how_it_is_wrong(got, says):
    verdict = answers.judge(got, 1.0, 0.03)
    assert not verdict.correct and says in verdict.why


def test_kv_cache_without_k_and_v_is_named(questions):
    inst = engine.instantiate(questions["kv-cache-bytes"], 3)
    assert engine.check(inst, repr(inst.expected)).correct
    outcome = engine.check(inst, repr(inst.expected / 2))
    assert not outcome.correct and "K and V" in outcome.why and "2 (K and V)" in outcome.explanation


def test_instances_are_reproducible_and_fresh(questions):
    q = questions["ring-allreduce-time"]
    assert engine.instantiate(q, 11).prompt == engine.instantiate(q, 11).prompt
    assert len({engine.instantiate(q, s).expected for s in range(20)}) > 10


def test_choice_order_and_multi_are_graded_through_the_shuffle(questions):
    inst = engine.instantiate(questions["benchmark-steps"], 5)
    right = engine.reveal(inst).expected
    assert engine.check(inst, right).correct
    assert not engine.check(inst, right[::-1]).correct
    multi = engine.instantiate(questions["resume-state"], 2)
    letters = engine.reveal(multi).expected
    assert engine.check(multi, letters).correct and not engine.check(multi, letters.split(",")[0]).correct
    with pytest.raises(answers.AnswerError):
        engine.check(multi, "z")


def test_wrong_answers_come_back_first(questions):
    pool = [questions[i] for i in ("mem-inference", "kv-per-token", "sync-required")]
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 60))
    history = [{"question": "mem-inference", "correct": True, "answered_at": stamp},
               {"question": "kv-per-token", "correct": False, "answered_at": stamp}]
    import random
    picked = schedule.pick(pool, history, 3, random.Random(0), now=now)
    assert [q.id for q in picked] == ["kv-per-token", "sync-required", "mem-inference"]


def test_measured_questions_need_the_learners_figure(questions):
    q = questions["measured-add-time"]
    with pytest.raises(engine.Unavailable, match="week07"):
        engine.instantiate(q, 1)
    assert engine.instantiate(q, 1, {"gbps": 2000.0}).expected == pytest.approx(3 * (2 ** 26 + 3) * 4 / 2e12 * 1e6)


def test_the_loop_records_each_answer_and_scores_by_topic(questions, tmp_path):
    progress = Progress(tmp_path / "p.db")
    instances = [engine.instantiate(questions[i], 4) for i in ("mem-inference", "sync-required", "kv-per-token")]
    replies = iter([repr(instances[0].expected), "what", "skip", "quit"])
    said = []

    def record(done):
        q = done.instance.question
        progress.record_drill(q.id, done.instance.seed, q.week, q.topic, "drill", done.outcome.correct, done.reply, 0)

    sitting = session.ask_all(instances, lambda _p: next(replies), said.append, on_answer=record)
    assert [a.outcome.correct for a in sitting.answered] == [True, False]
    assert [i.question.id for i in sitting.unanswered] == ["kv-per-token"]
    assert any("type the letter" in s for s in said)
    assert sitting.by_topic() == {"kv-cache": [0, 1], "measurement": [0, 1], "memory": [1, 1]}
    assert [r["correct"] for r in progress.drill_history()] == [True, False]


def test_selftest_suggests_weeks(tmp_path):
    root = Course().root
    instances = [engine.instantiate(q, 1) for q in content.load(root, selftest=True)]
    right = {"week01", "week04"}
    replies = iter(repr(i.expected) if i.question.numeric and i.question.week in right else
                   engine.reveal(i).expected if i.question.week in right else "skip" for i in instances)
    sitting = session.ask_all(instances, lambda _p: next(replies), lambda _s: None)
    result = selftest.suggestion(sitting)
    assert result["may_skip"] == ["week01", "week04"] and "week02" in result["do_first"]
    progress = Progress(tmp_path / "p.db")
    progress.record_selftest(result)
    assert "may skip week01, week04" in selftest.summary_line(progress.last_selftest())


def test_commands(tmp_path):
    runner = CliRunner()
    ws = tmp_path / "ws"
    assert runner.invoke(app, ["init", str(ws)]).exit_code == 0
    locked = runner.invoke(app, ["drill", "--workspace", str(ws)])
    assert locked.exit_code == 2 and "no week is unlocked" in locked.output
    assert runner.invoke(app, ["unlock", "week15", "--workspace", str(ws)]).exit_code == 0
    shown = runner.invoke(app, ["drill", "--json", "--seed", "3", "-n", "20", "--workspace", str(ws)])
    listed = json.loads(shown.stdout)["questions"]
    assert listed and {q["week"] for q in listed} == {"week15"} and all("answer" not in q for q in listed)
    kv = next(q for q in listed if q["id"] == "kv-per-token")
    inst = engine.instantiate(next(q for q in content.load(Course().root) if q.id == "kv-per-token"), 3)
    graded = runner.invoke(app, ["drill", "--json", "--question", kv["id"], "--seed", "3", "--answer",
                                 f"{inst.expected / 1e3} KB", "--workspace", str(ws)])
    assert graded.exit_code == 0 and json.loads(graded.stdout)["correct"] is True
    took = runner.invoke(app, ["selftest", "--json", "--seed", "1", "--workspace", str(ws)], input="skip\n" * 20)
    assert json.loads(took.stdout)["recorded"] is True
    status = json.loads(runner.invoke(app, ["status", "--json", "--workspace", str(ws)]).stdout)
    assert status["drills_by_topic"] == {"kv-cache": [1, 1]} and status["selftest"]["do_first"]
