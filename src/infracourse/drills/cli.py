"""`infracourse drill` and `infracourse selftest`: parse, call the drills engine, print.

Registered on the main app by infracourse.cli (`register`), which lends its guard (one-line errors) and its
workspace lookup; the engine (pydantic, the course files) is imported when a command runs, not at start-up,
and the questions come from the workspace's compiled bank (`content.bank`), not from the YAML, while no drill
file changed. Start-up figures: docs/cli-speed.md.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def register(app: typer.Typer, command: Callable, context: Callable, fail: Callable) -> None:
    """Add the two commands to `app`. command: the main app's guarded `@command`; context(workspace) -> (ws,
    course); fail(message) ends the command with one line."""

    @command("drill")
    def drill(week: Optional[str] = typer.Argument(None, help="Only this week's questions (default: every "
                                                   "week you have unlocked)."),
              count: int = typer.Option(10, "--count", "-n", min=1, help="Questions in this sitting."),
              mock: bool = typer.Option(False, "--mock", help="A timed mixed set, like a technical screen, "
                                        "scored per topic."),
              minutes: float = typer.Option(20.0, "--minutes", min=0.1, help="With --mock: the time allowed."),
              seed: Optional[int] = typer.Option(None, "--seed", help="Draw the same numbers again."),
              question: Optional[str] = typer.Option(None, "--question", help="Only this question id."),
              answer: Optional[str] = typer.Option(None, "--answer", help="With --question and --seed: grade "
                                                   "this reply and exit (for tools)."),
              as_json: bool = typer.Option(False, "--json", help="Print the questions (or, with --answer, the "
                                           "verdict) as JSON instead of asking."),
              workspace: Optional[Path] = typer.Option(None, "--workspace", "-w", help="Workspace folder.")):
        """Practise: estimates with fresh numbers, figures from your own grades, concept questions."""
        # why: start-up: the engine loads when a command runs (module docstring)
        from infracourse.drills import content, session

        ws, course = context(workspace)
        unlocked = set(ws.progress.unlocked())
        if week is not None:
            wanted = course.week(week).id
            if wanted not in unlocked:
                fail(f"{wanted} is locked: its drills open with it (`infracourse unlock {wanted}`)")
            weeks = {wanted}
        elif not unlocked:
            fail("no week is unlocked yet: drills follow the weeks you open (`infracourse next`)")
        else:
            weeks = unlocked
        if answer is not None and (question is None or seed is None):
            fail("--answer grades one question: give --question ID and --seed N too (as `drill --json` printed)")
        if mock:
            count = max(count, session.MOCK_QUESTIONS) if count == 10 else count
        sitting_seed = session.seed_from(seed)
        instances = session.choose(content.bank(course.root, cache=_bank_dir(ws)), ws.progress.drill_history(),
                                   ws.progress.last_grade, weeks=weeks, count=1 if question else count, mock=mock,
                                   seed=sitting_seed, only=question)
        if not instances:
            fail(f"no drill questions for {', '.join(sorted(weeks))} yet (measured ones need a recorded grade)")
        mode = "mock" if mock else "drill"

        def record(done: session.Answered) -> None:
            q = done.instance.question
            ws.progress.record_drill(q.id, done.instance.seed, q.week, q.topic, mode, done.outcome.correct,
                                     done.reply, done.seconds)

        if answer is not None:
            # why: start-up: the engine loads when a command runs (module docstring)
            from infracourse.drills import engine

            outcome = engine.check(instances[0], answer)
            record(session.Answered(instances[0], outcome, answer, 0.0))
            _show(outcome.as_dict() | instances[0].as_dict(), session.explain(outcome), as_json)
            raise typer.Exit(0 if outcome.correct else 1)
        if as_json:
            print(json.dumps({"seed": sitting_seed, "questions": [i.as_dict() for i in instances]}, indent=1))
            return
        import time

        deadline = time.monotonic() + minutes * 60 if mock else None
        if mock:
            console.print(f"mock screen: {len(instances)} questions, {minutes:g} minutes (seed {sitting_seed})")
        sitting = session.ask_all(instances, _ask, _say, on_answer=record, deadline=deadline)
        _print_sitting(sitting, per_topic=mock)

    @command("selftest")
    def selftest(as_json: bool = typer.Option(False, "--json", help="Questions on stderr, the result as JSON."),
                 seed: Optional[int] = typer.Option(None, "--seed", help="Draw the same numbers again."),
                 workspace: Optional[Path] = typer.Option(None, "--workspace", "-w", help="Workspace folder.")):
        """The start self-test: which early weeks to do first and which you may skip (recorded)."""
        # why: start-up: the engine loads when a command runs (module docstring)
        from infracourse.drills import content, engine, selftest as start, session

        ws, course = context(workspace)
        questions = content.bank(course.root, selftest=True, cache=_bank_dir(ws))
        if not questions:
            fail(f"{content.drills_dir(course.root) / content.SELFTEST_FILE} has no questions")
        chosen_seed = session.seed_from(seed)
        instances = [engine.instantiate(q, chosen_seed) for q in questions]
        say = (lambda text: err.print(text, markup=False)) if as_json else _say
        say(f"start self-test: {len(instances)} questions on weeks "
            f"{', '.join(sorted({q.week for q in questions}))}; `skip` if you do not know")
        sitting = session.ask_all(instances, _ask_on_stderr if as_json else _ask, say)
        result = start.suggestion(sitting)
        if sitting.answered:
            ws.progress.record_selftest(result)
        stored = ws.progress.last_selftest() if sitting.answered else None
        if as_json:
            print(json.dumps(result | {"recorded": bool(sitting.answered)}, indent=1))
            return
        console.print(start.summary_line(stored) if stored else "nothing answered: nothing recorded", markup=False)


def _bank_dir(ws) -> Path:
    return ws.meta / "cache"


def _ask(prompt: str) -> str:
    return input(prompt)


def _ask_on_stderr(prompt: str) -> str:
    """With --json, stdout carries only the result."""
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return input()


def _say(text: str) -> None:
    console.print(text, markup=False)


def _show(data: dict, text: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        _say(text)


def _print_sitting(sitting, per_topic: bool) -> None:
    data = sitting.as_dict()
    if not data["asked"]:
        return
    _say(f"{data['right']}/{data['asked']} right")
    if per_topic:
        for topic, (right, asked) in data["by_topic"].items():
            _say(f"  {topic:22} {right}/{asked}  {'█' * right}{'░' * (asked - right)}")
    if sitting.answered and not all(a.outcome.correct for a in sitting.answered):
        _say("what you missed comes back first next time (`infracourse drill`)")
    sys.stdout.flush()
