"""Versioned deploys: v2 (errors) and then v3 (a 3x slower step), each bad by the judge's fault, are started, found
worse by the gateway's canary and rolled back; afterwards v1 answers, no process of the bad version runs, and the
judge's requests did not fail meanwhile."""
import pytest

from infracourse.grader import LabCheckFailed
from week21_judging import BAD_VERSIONS, DEPLOY_REQUESTS, ROLLBACK_WINDOW_S, check_outputs

FAIL_BOUND = 0.05  # of the judge's requests during the rollout


@pytest.mark.check("rollback")
def test_bad_version_rolled_back(graded, judge_model, lab_check):
    bound = int(lab_check.threshold if lab_check.threshold is not None else FAIL_BOUND * DEPLOY_REQUESTS)
    for version, d in graded.phases["deploy"].get().items():
        fault = BAD_VERSIONS[version]
        fault = ("HTTP 500 for 60 % of its completions" if "error_rate" in fault
                 else f"every step {fault['extra_step_ms']:g} ms slower, no error")
        if not d["seen"]:
            raise LabCheckFailed(f"after POST /admin/deploy {{\"version\": \"{version}\"}} no service process of "
                                 f"version {version} ran (INFRACOURSE_VERSION={version} in its environment): start the "
                                 "new version next to the old one")
        still = [s for s in d["after"] if s["version"] == version]
        served = [v for p in d["probes"] for v in p["versions"] if v]
        if still or any(v != "v1" for v in served) or not served:
            raise LabCheckFailed(
                f"{version} was bad ({fault}, injected by the judge) and {ROLLBACK_WINDOW_S:g} s after the rollout's "
                f"load it was {'still running' if still else 'gone'}; the versions that answered the judge's probes: "
                f"{sorted(set(served)) or 'none'}, v1 expected. A health check does not see this badness: send the "
                "new version real requests (a canary) and compare BOTH its errors and its per-token time with the "
                "old version's (the judge deploys one version worse in each); when it is worse, stop it and keep "
                "serving v1")
        failed = [rec.error for rec in d["records"] if not rec.success]
        if len(failed) > bound:
            raise LabCheckFailed(
                f"{len(failed)} of the judge's {DEPLOY_REQUESTS} requests failed during the rollout of {version} "
                f"({fault}; at most {bound}); first: {failed[0][:200]}. Judge the canary before users meet it, or "
                "retry a canary request that failed on the old version (the same idempotency key)")
        check_outputs(judge_model, d["specs"], d["records"], f"the requests during the rollout of {version}")
