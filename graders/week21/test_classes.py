"""Two request classes: under a flood of class A, class B keeps its own share of the service. The judge's
clock: class B's P99 time to first token, its requests sent while 60 of class A wait."""
import pytest

from infracourse.grader import LabCheckFailed
from week21_judging import CLASS_B_REQUESTS, FLOOD_A, check_outputs


@pytest.mark.check("class-isolation")
def test_class_b_bounded_under_a_flood(graded, judge_model, lab_check, record):
    c = graded.phases["classes"].get()
    b, a = c["b"], c["a"]
    failed = [r.error for r in b["records"] if not r.success]
    if failed:
        raise LabCheckFailed(f"{len(failed)} of class B's {CLASS_B_REQUESTS} requests failed during class A's flood; "
                             f"first: {failed[0][:200]}. Class B has its own queue or quota: it is not refused "
                             "because class A filled the service")
    check_outputs(judge_model, b["specs"], b["records"], "class B")
    check_outputs(judge_model, a["specs"], a["records"], "class A")
    p99 = b["metrics"]["ttft_ms"]["p99"]
    bound = lab_check.threshold
    record("class b ttft p99", p99, target=bound, unit="ms")
    if p99 > bound:
        raise LabCheckFailed(
            f"class B's P99 time to first token was {p99:.0f} ms while {FLOOD_A} class-A requests waited (at most "
            f"{bound:g} ms; class A's median TTFT {a['metrics']['ttft_ms']['p50']:.0f} ms). One queue in arrival "
            "order puts every B behind the whole flood: give each class its own queue and, when the service has "
            "room, take turns between the non-empty queues (or reserve class B a share of the service's slots)")
