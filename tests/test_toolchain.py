"""The toolchain the labs were proven with is declared once (hardware.PROVEN), in pyproject.toml too, and
`infracourse doctor` warns outside it."""
import dataclasses
import re

from conftest import REPO

from infracourse.hardware import PROVEN, _release, detect, toolchain_warnings


def test_versions_compare_by_release():
    assert _release("2.13.0+cpu") == (2, 13, 0)
    assert _release("3.7.0rc1") == (3, 7, 0)
    assert _release("2.14.0.dev20260101") == (2, 14, 0)


def test_doctor_warns_outside_the_proven_range_only():
    hw = detect()
    inside = dataclasses.replace(hw, torch="2.13.0+cpu", triton="3.6.0")
    assert toolchain_warnings(inside) == []
    outside = toolchain_warnings(dataclasses.replace(hw, torch="2.10.0+cu128", triton="3.9.0"))
    assert len(outside) == 2 and 'pip install "triton>=3.6,<3.7"' in outside[1]


def test_pyproject_declares_the_same_ranges():
    text = (REPO / "pyproject.toml").read_text()
    for name, (low, high) in PROVEN.items():
        assert re.search(rf'"{name}>={re.escape(low)},<{re.escape(high)}[;"]', text), name


def test_doctor_and_week_1_name_the_missing_c_compiler_and_its_install(tmp_path, monkeypatch):
    """Week 1 compiles a C loop with `cc`: without one, doctor says so, and the grade's message names the fix
    (it was a bare FileNotFoundError: 'cc')."""
    import pytest

    from infracourse.kit.native import COURSE_LOOP, NO_C_COMPILER, compile_shared

    hw = dataclasses.replace(detect(), torch="2.13.0+cpu", triton="3.6.0")
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no compiler on it
    assert toolchain_warnings(hw) == [NO_C_COMPILER]
    assert "apt install build-essential" in NO_C_COMPILER and "`cc`" in NO_C_COMPILER
    with pytest.raises(RuntimeError, match="no C compiler"):
        compile_shared(COURSE_LOOP, tmp_path)
