"""A learner's rubric feedback, as `cohort publish --feedback` hands it out and `infracourse feedback WEEK`
reads it on the learner's machine.

The site gets one file per roster learner with a finished review, `feedback/<name>.json`, where name is an
HMAC of a fixed label under that learner's secret (the one they sign bundles with): only the holder of the
secret can find their file (the name carries neither the id nor the pseudonym), and the file's own HMAC under
the same secret tells the learner it came from whoever issued the secret, unchanged.

File format (format_version 1): {"format_version": 1, "weeks": {weekNN: [review, ...]}, "signature": hex}
where each review is what `rubric.feedback` gives (points, max, items: title, points, max, level, comment).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request
from pathlib import Path

FORMAT_VERSION = 1
FOLDER = "feedback"
_LABEL = b"infracourse-feedback:1"


class FeedbackError(Exception):
    """The learner's feedback cannot be read; the message says where it looked and what to do."""


def file_name(key: bytes) -> str:
    return hmac.new(key, _LABEL, hashlib.sha256).hexdigest()[:32] + ".json"


def pages(keys: dict[str, bytes], reviews: dict[tuple[str, str], list[dict]]) -> dict[str, str]:
    """Site path -> file text, for every learner in `keys` (id -> secret) with a finished review."""
    weeks: dict[str, dict[str, list[dict]]] = {}
    for (learner, week), shown in sorted(reviews.items()):
        if learner in keys:
            weeks.setdefault(learner, {})[week] = shown
    return {f"{FOLDER}/{file_name(keys[learner])}": json.dumps(
        {"format_version": FORMAT_VERSION, "weeks": mine, "signature": _sign(keys[learner], mine)}, indent=1) + "\n"
        for learner, mine in weeks.items()}


def read(site: str, key: bytes, week: str) -> list[dict]:
    """The finished reviews of `week` from the published site (a folder or an http(s) URL) for the holder of
    `key`; an empty list when the site has feedback for them but none for that week."""
    where = site.rstrip("/") + f"/{FOLDER}/{file_name(key)}"
    try:
        if site.startswith(("http://", "https://")):
            with urllib.request.urlopen(where, timeout=30) as reply:  # noqa: S310 - the course site's URL
                text = reply.read(4 << 20).decode()
        else:
            text = Path(where).read_text(encoding="utf-8")
    except (urllib.error.HTTPError, FileNotFoundError):
        raise FeedbackError(f"no feedback for you at {site}: your instructor has not published a finished review "
                            "of any of your weeks yet (or this is not the course site: check --site)") from None
    except (OSError, urllib.error.URLError, UnicodeDecodeError) as exc:
        raise FeedbackError(f"{where} cannot be read ({exc}); check --site and your connection") from None
    try:
        data = json.loads(text)
        weeks = data["weeks"]
        valid = data.get("format_version") == FORMAT_VERSION and hmac.compare_digest(
            str(data.get("signature")), _sign(key, weeks))
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise FeedbackError(f"{where} is not feedback signed for your secret (changed, or another course's): ask "
                            "your instructor to publish again")
    return weeks.get(week, [])


def _sign(key: bytes, weeks: dict) -> str:
    return hmac.new(key, json.dumps(weeks, sort_keys=True).encode(), hashlib.sha256).hexdigest()
