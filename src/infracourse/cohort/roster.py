"""The cohort's roster: who is enrolled, and the secret each learner signs their submissions with.

The instructor imports a CSV (`id, name, email`, optionally the LMS's own ids: `sis_user_id`,
`sis_login_id`, `section`, `canvas_id`, `idnumber`) into the gradebook, which issues each new learner a
random 256-bit secret and keeps it. `cohort roster secrets --out DIR` writes one `<id>.secret` file per
learner (and `secrets.csv` for a mail merge); the learner keeps theirs and `infracourse submit --secret-file`
(or `secret:` in the workspace config) signs each bundle with it. An id in a bundle is then believed only
when the bundle is signed by that id's secret: a learner cannot hand in under another's name, and a bundle
of someone who is not on the roster is refused.

A secret is one line, `infracourse-secret:1:<learner id>:<64 hex digits>`: it names its learner, so submit
can tell a learner who picked up someone else's file.
"""
from __future__ import annotations

import csv
import io
import os
import re
import secrets
from dataclasses import dataclass, fields
from pathlib import Path

LEARNER_ID = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$"  # a learner's id: in the roster, a secret and a bundle's manifest
SECRET_PREFIX = "infracourse-secret:1:"
_SECRET = re.compile(r"^infracourse-secret:1:(?P<learner>[^:\s]+):(?P<key>[0-9a-f]{64})$")
REQUIRED = ("id", "name", "email")
OPTIONAL = ("sis_user_id", "sis_login_id", "section", "canvas_id", "idnumber")  # what an LMS matches rows by
ALIASES = {"e-mail": "email", "email address": "email", "learner": "id", "student": "name"}


class RosterError(Exception):
    """A roster or a secret cannot be used; the message names the file, the row and the fix."""


@dataclass(frozen=True)
class Learner:
    id: str
    name: str
    email: str
    sis_user_id: str = ""
    sis_login_id: str = ""
    section: str = ""
    canvas_id: str = ""
    idnumber: str = ""


def read_roster(path: Path) -> list[Learner]:
    """Learners of a roster CSV (a header row naming at least id, name, email); every fault is named."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a spreadsheet's BOM is not part of the header
    except (OSError, UnicodeDecodeError) as exc:
        raise RosterError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc}); save the roster "
                          "as a UTF-8 CSV file") from None
    rows = csv.reader(io.StringIO(text))
    header = [ALIASES.get(h.strip().lower(), h.strip().lower()) for h in next(rows, [])]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise RosterError(f"{path}: the header row lacks {', '.join(missing)}; the first row must name the "
                          f"columns, at least `{','.join(REQUIRED)}` (optional: {', '.join(OPTIONAL)})")
    wanted = {name: header.index(name) for name in REQUIRED + OPTIONAL if name in header}
    learners, ids, emails = [], {}, {}
    for line, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        values = {name: (row[i].strip() if i < len(row) else "") for name, i in wanted.items()}
        learner = Learner(**values)
        where = f"{path}, line {line}"
        if not re.fullmatch(LEARNER_ID, learner.id):
            raise RosterError(f"{where}: id {learner.id!r} is not a learner id (letters, digits and . _ @ + -, at "
                              "most 64, starting with a letter or digit): it must be what learners pass to "
                              "`infracourse submit --learner`")
        if "@" not in learner.email:
            raise RosterError(f"{where}: {learner.email!r} is not an e-mail address")
        for seen, key, what in ((ids, learner.id, "id"), (emails, learner.email.lower(), "e-mail")):
            if key in seen:
                raise RosterError(f"{where}: {what} {key!r} is already on line {seen[key]}; one row per learner")
            seen[key] = line
        learners.append(learner)
    if not learners:
        raise RosterError(f"{path}: no learners below the header row")
    return learners


def new_key() -> str:
    return secrets.token_hex(32)


def format_secret(learner: str, key_hex: str) -> str:
    return f"{SECRET_PREFIX}{learner}:{key_hex}"


def parse_secret(text: str) -> tuple[str, bytes]:
    """(learner id, key) of a secret line; RosterError says what is wrong with it (never echoes the key)."""
    match = _SECRET.fullmatch(text.strip())
    if not match:
        raise RosterError("not an infracourse secret (one line `infracourse-secret:1:ID:64 hex digits`): use the "
                          "file your instructor sent you, unchanged")
    return match["learner"], bytes.fromhex(match["key"])


def write_secrets(entries: list[tuple[Learner, str]], out: Path) -> list[Path]:
    """One `<id>.secret` per learner (readable by its owner only) and `secrets.csv` (id, name, email, secret)
    in `out`, a new or empty folder: secrets are not written over other files."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise RosterError(f"{out} is not empty: write the secrets to a new folder (they are the only thing that "
                          "proves a learner's identity; keep the folder private)")
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    written = []
    with _private(out / "secrets.csv") as fh:
        writer = csv.writer(fh)
        writer.writerow([f.name for f in fields(Learner)] + ["secret"])
        for learner, key in entries:
            writer.writerow([getattr(learner, f.name) for f in fields(Learner)] + [format_secret(learner.id, key)])
    for learner, key in entries:
        path = out / f"{learner.id}.secret"
        with _private(path) as fh:
            fh.write(format_secret(learner.id, key) + "\n")
        written.append(path)
    return written


def _private(path: Path):
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", newline="", encoding="utf-8")
