"""hardware: the one place that knows the machine (here, how busy its CPU is)."""
import os

from infracourse import hardware
from infracourse.grading import plugin


def test_cpu_contention_is_load_per_core_at_least_one_and_names_a_busy_machine(monkeypatch):
    """hardware.cpu_contention, and the note a failed check gets when the grade's machine was busy."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 1.0, 1.0))
    assert hardware.cpu_contention() == 3.0
    assert plugin._busy_note() == "; this machine was busy: load average 6.0 on 2 cores"
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 1.0, 1.0))
    assert hardware.cpu_contention() == 1.0 and plugin._busy_note() == ""

    def unavailable():
        raise OSError("no load average here")
    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert hardware.cpu_contention() == 1.0 and plugin._busy_note() == ""
