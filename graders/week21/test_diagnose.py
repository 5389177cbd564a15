"""Diagnosis: for each fault the judge injects into a course service under steady load (its process killed,
a flood of requests, a dependency that slows every step), the learner's diagnose(logs, metrics) names it and
says when it began, from the service's own logs and the judge's scrapes of its metrics alone."""
import pytest

from infracourse.grader import LabCheckFailed
from week21_judging import DIAG_FAULTS, DIAG_TOLERANCE_S


@pytest.mark.check("diagnose-faults")
def test_diagnose_names_each_fault(learner, scenarios, record):
    diagnose = learner.module("diagnose").diagnose
    worst = 0.0
    for sc in scenarios:
        if sc.failure:
            raise RuntimeError(sc.failure)
        answer = diagnose(sc.logs, sc.metrics)
        if not isinstance(answer, dict) or answer.get("fault") not in DIAG_FAULTS:
            raise LabCheckFailed(f"diagnose(logs, metrics) must return {{\"fault\": one of {list(DIAG_FAULTS)}, "
                                 f"\"began_at\": epoch seconds}}; for the judge's {sc.fault} it returned "
                                 f"{answer!r:.200}")
        if answer["fault"] != sc.fault:
            raise LabCheckFailed(
                f"the judge injected {sc.fault} at {sc.began_at:.2f} (epoch s) into a service under a steady 4 "
                f"requests/s; diagnose named {answer['fault']!r}. Tell them apart by what changes first: a process "
                "exit stops the logs and the scrapes (up 0); an overload raises arrivals and the waiting queue "
                "while a step's time stays put; a slow dependency raises the time of each step "
                "(step_seconds_total / steps_total over a window) while arrivals stay put")
        began = answer.get("began_at")
        if isinstance(began, bool) or not isinstance(began, (int, float)):
            raise LabCheckFailed(f"for {sc.fault}, began_at must be a number (epoch seconds), got {began!r}")
        off = abs(began - sc.began_at)
        worst = max(worst, off)
        if off > DIAG_TOLERANCE_S:
            raise LabCheckFailed(
                f"{sc.fault} began at {sc.began_at:.2f} by the judge's clock; diagnose says {began:.2f}, "
                f"{off:.2f} s off (at most {DIAG_TOLERANCE_S:g} s). The onset is the first sample or log line that "
                "leaves the steady state, not the moment the damage became large")
    record("onset error", worst, unit="s")
