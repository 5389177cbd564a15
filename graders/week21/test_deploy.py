"""Versioned deploy: v2 (bad by the judge's fault) is started, found worse by the gateway's canary and rolled
back; afterwards v1 answers, no v2 process runs, and the judge's requests did not fail meanwhile."""
import pytest

from infracourse.grader import LabCheckFailed
from week21_judging import DEPLOY_REQUESTS, ROLLBACK_WINDOW_S, check_outputs

FAIL_BOUND = 0.05  # of the judge's requests during the rollout


@pytest.mark.check("rollback")
def test_bad_version_rolled_back(graded, judge_model, lab_check):
    d = graded.phases["deploy"].get()
    fault = ("HTTP 500 for 60 % of its completions" if "error_rate" in graded.v2_fault
             else f"every step {graded.v2_fault['extra_step_ms']:g} ms slower")
    if not d["v2_seen"]:
        raise LabCheckFailed("after POST /admin/deploy {\"version\": \"v2\"} no service process of version v2 ran "
                             "(INFRACOURSE_VERSION=v2 in its environment): start the new version next to the old one")
    still = [s for s in d["after"] if s["version"] == "v2"]
    served = [v for p in d["probes"] for v in p["versions"] if v]
    if still or any(v != "v1" for v in served) or not served:
        raise LabCheckFailed(
            f"v2 was bad ({fault}, injected by the judge) and {ROLLBACK_WINDOW_S:g} s after the rollout's load it "
            f"was {'still running' if still else 'gone'}; the versions that answered the judge's probes: "
            f"{sorted(set(served)) or 'none'}, v1 expected. A health check does not see this badness: send the "
            "new version real requests (a canary) and compare its errors and per-token time with the old "
            "version's; when it is worse, stop it and keep serving v1")
    failed = [rec.error for rec in d["records"] if not rec.success]
    bound = int(lab_check.threshold if lab_check.threshold is not None else FAIL_BOUND * DEPLOY_REQUESTS)
    if len(failed) > bound:
        raise LabCheckFailed(
            f"{len(failed)} of the judge's {DEPLOY_REQUESTS} requests failed during the rollout (at most {bound}); "
            f"first: {failed[0][:200]}. Judge the canary before users meet it, or retry a canary request that "
            "failed on the old version (the same idempotency key)")
    check_outputs(judge_model, d["specs"], d["records"], "the rollout's requests")
