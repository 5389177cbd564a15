"""The shared torchrun launcher (grading.torchrun): a launch that loses a rank to a runtime signal with no
Python error is launched once more and the second run stands; one that keeps dying fails, saying so."""
import pytest

from infracourse.grading.torchrun import run_ranks

pytestmark = pytest.mark.slow

ABORT_ONCE = '''import os
from pathlib import Path

import torch.distributed as dist


def work(value):
    # the first launch's rank 1 aborts (a marker in the shared scratch folder, HOME, remembers it; TMPDIR is each
    # sandbox's own /tmp); the second runs
    marker = Path(os.environ["HOME"]) / "aborted-once"
    if dist.get_rank() == 1 and not marker.exists():
        marker.write_text("x")
        os.abort()
    return value + dist.get_rank()


def always(value):
    if dist.get_rank() == 1:
        os.abort()
    return value
'''


def test_a_rank_lost_to_a_signal_is_launched_again(tmp_path):
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "ranks_abort.py").write_text(ABORT_ONCE)
    run = run_ranks("ranks_abort", "work", learner_dir=learner, world_size=2, kwargs={"value": 10},
                    scratch=tmp_path / "once", timeout_s=120)
    assert run.failure() is None, run.failure()
    assert run.attempts == 2 and run.outputs == [10, 11]


def test_a_rank_that_always_aborts_fails_after_two_launches(tmp_path):
    learner = tmp_path / "learner"
    learner.mkdir()
    (learner / "ranks_abort.py").write_text(ABORT_ONCE)
    run = run_ranks("ranks_abort", "always", learner_dir=learner, world_size=2, kwargs={"value": 1},
                    scratch=tmp_path / "always", timeout_s=120)
    assert run.attempts == 2 and run.died_by_signal()
    assert "launched twice" in run.failure() and "SIGABRT" in run.failure()
