"""An instructor's check of a learner's completion certificate (`infracourse status --completion --certificate`)
against the gradebook: `infracourse cohort verify-certificate FILE.json`.

The grades it is checked against are the instructor's own: the newest verified result (`cohort regrade`) of
the learner's newest submission of each week. A week never submitted, or submitted and never regraded, counts
as not graded: a self-reported result proves nothing, so every criterion the certificate claims met on it is
reported (completion.verify_certificate). A certificate naming another track than the learner's project
submissions, or another learner than the one checked, is reported too.
"""
from __future__ import annotations

import json
from pathlib import Path

from infracourse.cohort.gradebook import Gradebook
from infracourse.completion import verify_certificate
from infracourse.course import Course
from infracourse.grading.results import GradeResult


class CertificateError(Exception):
    """The file is not a certificate that can be checked; the message names it and says what to pass."""


def load_certificate(path: Path) -> dict:
    """A certificate's JSON; CertificateError naming the file when it is unreadable, not JSON, or not one."""
    path = Path(path)
    try:
        cert = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CertificateError(f"{path}: cannot be read ({exc.strerror}); pass the completion.json the learner "
                               "sent") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CertificateError(f"{path}: not JSON ({exc}); pass the completion.json that `infracourse status "
                               "--completion --certificate DIR` wrote, unchanged") from None
    if not isinstance(cert, dict) or cert.get("kind") != "infracourse-completion" \
            or not isinstance(cert.get("criteria"), list) \
            or not all(isinstance(c, dict) and isinstance(c.get("backing", []), list)
                       and all(isinstance(b, dict) for b in c.get("backing", [])) for c in cert["criteria"]):
        raise CertificateError(f"{path}: not an infracourse completion certificate (its `kind` must be "
                               "infracourse-completion, with a list of criteria); pass the completion.json that "
                               "`infracourse status --completion --certificate DIR` wrote")
    return cert


def verified_results(book: Gradebook, learner: str) -> tuple[dict[str, GradeResult], set[str]]:
    """(week -> the newest verified result of the learner's newest submission of it, the tracks those
    submissions name). Weeks never regraded are absent: not graded."""
    results, tracks = {}, set()
    for sub in book.latest_submissions(learner=learner):
        if sub.track:
            tracks.add(sub.track)
        verified = book.results_of(sub.id, "verified")
        if verified:
            results[sub.week] = verified[-1][1]
    return results, tracks


def verify(book: Gradebook, course: Course, cert: dict,
           learner: str | None = None) -> tuple[str, dict[str, GradeResult], list[str]]:
    """(the learner checked, the verified grades used, what those grades do not bear out: [] when they bear
    out all the certificate claims)."""
    who = learner or cert.get("learner")
    if not isinstance(who, str) or not who:
        raise CertificateError("the certificate names no learner: pass --learner ID (their id in the gradebook)")
    results, tracks = verified_results(book, who)
    problems = []
    if cert.get("learner") not in (None, who):
        problems.append(f"the certificate is issued to {cert.get('learner')!r}, not {who!r}")
    if cert.get("track") and tracks and cert["track"] not in tracks:
        problems.append(f"the certificate names track {cert['track']!r}; {who}'s project submissions name "
                        f"{', '.join(sorted(tracks))}")
    return who, results, problems + verify_certificate(cert, course, results)
