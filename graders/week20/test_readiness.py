"""Liveness and readiness: /health answers while the model loads, /ready only once it is loaded."""
import pytest

from infracourse.grader import LabCheckFailed
from week20_judging import LOAD_DELAY_S, expect_tokens


@pytest.mark.check("readiness")
def test_ready_only_when_loaded(served, judge_model):
    with served.teaching():
        r = served.phases["readiness"].get()
        polls = r["polls"]
        what = f"the judge makes your model's load take {LOAD_DELAY_S:g} s (ServiceModel.load, INFRACOURSE_SERVICE)"
        if r["health"] != 200:
            raise LabCheckFailed(f"{what}: GET /health answered HTTP {r['health']} while the model loaded; liveness is "
                                 "'the process serves': answer 200 at once, whatever the model's state")
        ready_at = next((t for t, status in polls if status == 200), None)
        if polls[-1][1] not in (200, 503):
            raise LabCheckFailed(f"{what}: GET /ready answered HTTP {polls[-1][1]} {polls[-1][0]:.2f} s after launch; "
                                 "answer 503 while the model loads and 200 once model.loaded is true")
        if ready_at is None:
            raise LabCheckFailed(f"{what}: /ready never answered 200 within 60 s of the start (last answers "
                                 f"{[s for _, s in polls[-3:]]}); answer 200 once model.loaded is true")
        if polls[0][1] == 200 and r["health_s"] >= LOAD_DELAY_S:
            raise LabCheckFailed(
                f"{what}: GET /health answered {r['health_s']:.2f} s after launch, once the model had loaded (the "
                "first /ready after it was 200). Liveness must not wait for the model: the server answers /health at "
                "once while the load runs in a background thread started at start-up")
        if polls[0][1] == 200:
            raise LabCheckFailed(
                f"{what}: the first GET /ready, {polls[0][0]:.2f} s after launch (as soon as /health answered), was "
                "already 200. Readiness must say 503 while the model loads: load it in a background thread started "
                "at start-up and answer /ready from model.loaded. (If the load runs before the server answers at all, "
                "liveness waits for it too)")
        not_ready = [s for _, s in polls if s != 200]
        if any(s != 503 for s in not_ready):
            raise LabCheckFailed(f"{what}: while loading /ready answered {sorted(set(not_ready))}; answer 503 (Service "
                                 "Unavailable) until the model is loaded")
        if any(s != 200 for s in r["after"]):
            raise LabCheckFailed(f"{what}: once ready, /ready answered {r['after']} to the next polls; stay ready")
        expect_tokens(judge_model, r["completion"], r["prompt"], 8, "the first completion once /ready said 200")
