"""Week 24, a failure case the judge provokes: the batch quota set too low (0 slots). Batch starves by
configuration; the gateway must say so at once (429/503), not hold batch requests forever, and interactive
must not notice."""
import pytest

from infracourse.grader import LabCheckFailed



@pytest.mark.check("quota-too-low")
def test_zero_batch_quota_refuses_at_once(starved, lab_check, record):
    runs = starved.get()
    batch, _, _ = runs["batch"]
    interactive, _, _ = runs["interactive"]
    lost = [t.record.error for t in interactive if not t.record.success]
    if lost:
        raise LabCheckFailed(f"with batch's quota at 0 slots, {len(lost)} of {len(interactive)} interactive requests "
                             f"failed; first: {lost[0][:200]}. A misconfigured batch class must not touch interactive")
    served = [t for t in batch if t.record.success]
    if served:
        raise LabCheckFailed(f"batch's quota was 0 slots, yet {len(served)} batch request(s) were served: the quota "
                             "is not what decides how many batch requests reach the service")
    slow = [t for t in batch if not t.refused or t.ended - t.record.send_time > lab_check.threshold]
    record("batch refused", sum(t.refused for t in batch), unit="requests")
    if slow:
        t = slow[0]
        raise LabCheckFailed(
            f"with batch's quota at 0 slots, {len(slow)} of {len(batch)} batch requests were not refused at once: one "
            f"ended after {t.ended - t.record.send_time:.1f} s with {t.record.error[:120]!r} (a 429 or 503 within "
            f"{lab_check.threshold:g} s expected). A class that can never get a slot is refused on arrival; a queue "
            "that nothing drains holds its requests until their clients give up")
