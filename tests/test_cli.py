"""The learner's whole loop through the CLI: init -> unlock -> grade (fails) -> solve -> grade (passes) -> status."""
import json
import shutil

import pytest
from typer.testing import CliRunner

from infracourse.cli import app

from conftest import REPO

runner = CliRunner()


def invoke(*args, ws=None):
    env = {"INFRACOURSE_WORKSPACE": str(ws)} if ws else {}
    return runner.invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)


@pytest.mark.slow
def test_learner_loop_on_week07(tmp_path, machine):
    ws = tmp_path / "infra"
    assert invoke("init", ws).exit_code == 0
    nxt = invoke("next", ws=ws)
    assert "week01" in nxt.output
    out = invoke("unlock", "w7", ws=ws)
    assert out.exit_code == 0 and "vector_ops.py" in out.output
    failing = invoke("grade", "week07", "--json", ws=ws)
    assert failing.exit_code == 1
    result = json.loads(failing.output)
    assert result["counts"]["passed"] == 0 and not result["complete"]
    for f in (REPO / "labs/week07-triton-basics/solution").iterdir():
        shutil.copy(f, ws / "week07" / f.name)
    assert invoke("report", "7", ws=ws).exit_code == 0
    passing = invoke("grade", "7", ws=ws)
    assert passing.exit_code == 0, passing.output
    assert "week07 complete" in passing.output
    status = json.loads(invoke("status", "--json", ws=ws).output)
    week7 = next(w for w in status["weeks"] if w["week"] == "week07")
    assert week7["state"] == ("verified-on-GPU" if machine.gpu_count else "passed")
    assert week7["attempts"] == 2 and len(status["weeks"]) == 24


def test_commands_outside_a_workspace_say_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INFRACOURSE_WORKSPACE", raising=False)
    out = runner.invoke(app, ["status"])
    assert out.exit_code == 2 and "infracourse init" in out.output


def test_unknown_week_and_planned_week(tmp_path):
    ws = tmp_path / "infra"
    invoke("init", ws)
    bad = invoke("grade", "week99", ws=ws)
    assert bad.exit_code == 2 and "'week99' is not a week" in bad.output  # both quotes: the name as typed
    planned = invoke("grade", "week20", ws=ws)
    assert planned.exit_code == 2 and "planned" in planned.output
    locked = invoke("grade", "week07", ws=ws)
    assert locked.exit_code == 2 and "infracourse unlock week07" in locked.output


def test_hints_reveal_one_more_each_call(tmp_path):
    ws = tmp_path / "infra"
    invoke("init", ws)
    first = invoke("hint", "7", ws=ws).output
    second = invoke("hint", "7", ws=ws).output
    assert "Hint 1/" in first and "Hint 2/" not in first and "Hint 2/" in second


def test_reset_keeps_a_backup(tmp_path):
    ws = tmp_path / "infra"
    invoke("init", ws)
    invoke("unlock", "7", ws=ws)
    (ws / "week07" / "vector_ops.py").write_text("# mine\n")
    out = invoke("reset", "7", ws=ws)
    assert f"{ws / 'week07'}/.backup-" in out.output  # the whole path on one line, however long it is
    backups = list((ws / "week07").glob(".backup-*/vector_ops.py"))
    assert backups and backups[0].read_text() == "# mine\n"


def test_doctor_and_syllabus(machine):
    doctor = json.loads(invoke("doctor", "--json").output)
    assert doctor["hardware"]["tier"] == machine.tier
    if not machine.gpu_count:
        assert any("add-bandwidth" in c for c in doctor["blocked"]["week07"])
        assert invoke("doctor", "--calibrate").exit_code == 2
    schema = json.loads(invoke("syllabus", "--schema").output)
    assert "lab.yaml" in schema
    assert "Triton basics" in invoke("syllabus", "7").output
