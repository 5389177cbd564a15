"""launch.environment: what every confined process of a grade (worker, ranks, servers, `infracourse run`) sees."""
from __future__ import annotations

from pathlib import Path

from infracourse import launch


def test_one_openmp_thread_unless_the_judge_set_a_count(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert launch.environment(tmp_path)["OMP_NUM_THREADS"] == "1"
    assert launch.environment(tmp_path, device="cpu")["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # a learner's own choice is kept
    assert launch.environment(tmp_path)["OMP_NUM_THREADS"] == "4"
    assert launch.environment(tmp_path, OMP_NUM_THREADS="2")["OMP_NUM_THREADS"] == "2"  # a check's own count


def test_the_judges_paths_are_not_passed_on(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/of/the/judge")
    monkeypatch.setenv("INFRACOURSE_HOME", "/the/workspace")
    env = launch.environment(tmp_path)
    assert env["PYTHONPATH"] == launch.engine_path() and "INFRACOURSE_HOME" not in env
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
