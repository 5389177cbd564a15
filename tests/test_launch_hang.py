"""A launched world that deadlocks is paid once per grade (issue 30): the launch that overran its limit is
remembered, and a later launch of the same code is not started; its check fails saying which check hung and
what to look for. Across judge processes the runner remembers it, as it does a worker function that hung."""
import shutil
import time

import pytest
from conftest import replace_once

from infracourse.grading.runner import grade
from infracourse.grading.torchrun import LaunchNotRun, run_ranks, start_ranks
from infracourse.failures import LabCheckFailed
from infracourse.launch import hangs

LIMIT_S = 8

DEADLOCK = '''import torch
import torch.distributed as dist


def both_receive_first():
    # every rank waits for its neighbour's message before sending its own: the textbook ring deadlock
    buf = torch.zeros(4)
    dist.recv(buf, (dist.get_rank() + 1) % dist.get_world_size())
    dist.send(buf, (dist.get_rank() + 1) % dist.get_world_size())
    return 0
'''


@pytest.fixture
def grade_state():
    hangs.forget()
    yield
    hangs.forget()


@pytest.fixture
def deadlocking(tmp_path):
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "ring.py").write_text(DEADLOCK)
    return learner


@pytest.mark.slow
def test_a_deadlocked_world_is_launched_once_per_grade(grade_state, deadlocking, tmp_path):
    told = []
    hangs.connect(lambda target, inputs: told.append((target, inputs)), set())
    hangs.checking("first-check", 600)
    first = run_ranks("ring", "both_receive_first", learner_dir=deadlocking, world_size=2, timeout_s=LIMIT_S,
                      scratch=tmp_path / "first")
    assert first.timed_out and f"did not finish within its time limit ({LIMIT_S} s)" in first.failure()
    assert "a collective that never completes" in first.failure()
    assert told == [("ring.both_receive_first", "2 ranks under torchrun")]  # the runner hears of it

    hangs.checking("second-check", 600)
    t0 = time.monotonic()
    second = run_ranks("ring", "both_receive_first", learner_dir=deadlocking, world_size=2, timeout_s=LIMIT_S,
                       scratch=tmp_path / "second")
    assert time.monotonic() - t0 < 1.0  # not started: nothing to wait for
    assert second.failure().startswith(f"not run: ring.both_receive_first did not finish within {LIMIT_S} s in "
                                       "check 'first-check'")
    assert "fix it and grade again" in second.failure() and len(told) == 1
    with pytest.raises(LaunchNotRun) as refused:  # the lower-level start (a grader that collects itself)
        start_ranks("ring", "both_receive_first", learner_dir=deadlocking, world_size=2, scratch=tmp_path / "x")
    assert isinstance(refused.value, LabCheckFailed)  # a check that meets it fails (not an error)


def test_a_launch_that_an_earlier_judge_saw_hang_is_not_started(grade_state, deadlocking, tmp_path):
    """The runner killed an earlier judge at a check's limit during this launch: the next judge is told."""
    hangs.connect(lambda target, inputs: pytest.fail("a refused launch must not be announced"),
                  {"ring.both_receive_first"})
    run = run_ranks("ring", "both_receive_first", learner_dir=deadlocking, world_size=2, scratch=tmp_path / "r")
    assert run.failure().startswith("not run: ring.both_receive_first overran an earlier check's time limit in "
                                    "this grade")


def test_a_launch_ends_before_its_check_does(grade_state, monkeypatch):
    """So that the launch, not the runner, stops a hung world and the judge lives on to remember it."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(hangs.TEST_LIMIT_ENV, raising=False)
    monkeypatch.setenv(hangs.SCALE_ENV, "2")
    assert hangs.limit(120) == 120  # outside a check: the grader's own limit
    hangs.checking("c", 30)  # 60 s once scaled
    assert 50 < hangs.limit(120) <= 55
    hangs.call_began()  # on a GPU the runner's clock runs from the check's start: no fresh limit
    assert hangs.limit(120) <= 55
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    hangs.checking("c", 300)
    time.sleep(1.0)
    hangs.call_began()  # under the interpreter each call (a launch among them) gets the whole limit afresh
    assert hangs.limit(1000) > 595 - 0.5
    monkeypatch.setenv(hangs.TEST_LIMIT_ENV, "7")
    assert hangs.limit(120) == 7




@pytest.mark.slow
def test_a_server_that_never_comes_up_is_started_once_per_grade(grade_state, tmp_path):
    from infracourse.grading.serving import ServerFailed, serve

    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "server.py").write_text("import time\n\ntime.sleep(3600)  # start-up that never ends\napp = None\n")
    hangs.checking("serve-first", 600)
    with pytest.raises(ServerFailed, match="did not answer on its socket within 5 s"):
        with serve(learner, scratch=tmp_path / "s1", ready_timeout_s=5):
            pass
    hangs.checking("serve-second", 600)
    t0 = time.monotonic()
    with pytest.raises(ServerFailed) as refused:
        with serve(learner, scratch=tmp_path / "s2", ready_timeout_s=5):
            pass
    assert time.monotonic() - t0 < 1.0
    assert str(refused.value).startswith("not run: server:app under uvicorn did not answer within 5 s in check "
                                         "'serve-first'")


WEEK11_LIMIT_S = 25
LAUNCHED_CHECKS = ("reduce-scatter", "all-gather", "all-reduce", "broadcast", "point-to-point-only",
                   "all-reduce-is-rs-ag")
KIT_TARGET = "infracourse.kit.collectives.grade_rank"


@pytest.mark.slow
def test_a_deadlocking_ring_costs_week_11_one_launch_limit(course, machine, tmp_path, monkeypatch):
    """Week 11 with the ring's textbook deadlock (every rank receives before it sends): the 3-rank launch
    overruns its (shortened) limit once; the 2-rank launch after it is never started (the runner hears of one
    launch only), and every check that needs them fails (not errors) saying why."""
    monkeypatch.setenv(hangs.TEST_LIMIT_ENV, str(WEEK11_LIMIT_S))
    lab = course.lab("week11")
    folder = tmp_path / "learner"
    shutil.copytree(lab.solution, folder)
    source = (folder / "collectives.py").read_text()
    every_rank_receives_first = replace_once("    if rank % 2 == 0:\n        dist.send(", "    if False:\n        dist.send(")
    (folder / "collectives.py").write_text(every_rank_receives_first(source))
    events = []
    result = grade(course, lab, folder, hardware=machine, on_event=events.append)
    checks = {c.id: c for c in result.checks}
    for check in LAUNCHED_CHECKS:
        assert checks[check].status == "failed", (check, checks[check].status, checks[check].message)
        assert f"did not finish within its time limit ({WEEK11_LIMIT_S} s)" in checks[check].message, check
        assert "later launches of the same code in this grade are not started" in checks[check].message
    launches = [e for e in events if e["event"] == "calling" and e["target"] == KIT_TARGET]
    assert [e["inputs"] for e in launches] == ["3 ranks under torchrun"], launches  # the 2-rank one never began
    assert not result.complete
