"""The learner's progress database: the one owner of `<workspace>/.infracourse/progress.db`.

On-disk format (SQLite, `PRAGMA user_version` = SCHEMA_VERSION):
  unlocks(week PRIMARY KEY, unlocked_at)
  grades(id, week, started_at, seconds, tier, device, fingerprint, complete, verified_on_gpu, result_json)
  checks(grade_id, check_id, status, message, value, target, unit)   one row per check of a grade
  hints(week PRIMARY KEY, shown)                                       how many hints were revealed
A grade and all its checks are written in one transaction, so a Ctrl-C or a kill during grading leaves
every earlier result intact and never half a grade. WAL mode keeps readers off the writer's way.
"""
from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from infracourse.grading.results import GradeResult

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS unlocks (week TEXT PRIMARY KEY, unlocked_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS grades (
    id INTEGER PRIMARY KEY AUTOINCREMENT, week TEXT NOT NULL, started_at TEXT NOT NULL, seconds REAL NOT NULL,
    tier TEXT NOT NULL, device TEXT NOT NULL, fingerprint TEXT NOT NULL, complete INTEGER NOT NULL,
    verified_on_gpu INTEGER NOT NULL, result_json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS grades_by_week ON grades (week, id);
CREATE TABLE IF NOT EXISTS checks (
    grade_id INTEGER NOT NULL REFERENCES grades(id), check_id TEXT NOT NULL, status TEXT NOT NULL,
    message TEXT NOT NULL, value REAL, target REAL, unit TEXT, PRIMARY KEY (grade_id, check_id));
CREATE TABLE IF NOT EXISTS hints (week TEXT PRIMARY KEY, shown INTEGER NOT NULL);
"""


class ProgressError(Exception):
    """The progress database cannot be used; the message names the file and the fix."""


class Progress:
    def __init__(self, path: Path):
        self.path = path
        try:
            with closing(self._connect()) as db, db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise ProgressError(f"{path} was written by a newer infracourse (schema {version}); upgrade "
                                        "infracourse to use this workspace")
                db.executescript(SCHEMA)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise ProgressError(f"{path} is not a readable progress database ({exc}); move it aside and run "
                                "`infracourse init` again to start a fresh one") from None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    # ------------------------------------------------------------ unlocks
    def unlock(self, week: str) -> bool:
        """Record an unlock; False if the week was already unlocked."""
        with closing(self._connect()) as db, db:
            cur = db.execute("INSERT OR IGNORE INTO unlocks VALUES (?, ?)", (week, _now()))
            return cur.rowcount == 1

    def unlocked(self) -> dict[str, str]:
        with closing(self._connect()) as db:
            return dict(db.execute("SELECT week, unlocked_at FROM unlocks"))

    # ------------------------------------------------------------ grades
    def record(self, result: GradeResult) -> int:
        """Store a grade and its checks atomically; returns the grade id."""
        with closing(self._connect()) as db, db:
            cur = db.execute(
                "INSERT INTO grades (week, started_at, seconds, tier, device, fingerprint, complete, verified_on_gpu,"
                " result_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (result.week, result.started_at, result.seconds, result.tier, result.device, result.fingerprint,
                 int(result.complete), int(result.verified_on_gpu), json.dumps(result.as_dict())))
            grade_id = cur.lastrowid
            rows = []
            for c in result.checks:
                head = c.headline or {}
                rows.append((grade_id, c.id, c.status, c.message, _number(head.get("value")),
                             _number(head.get("target")), head.get("unit")))
            db.executemany("INSERT INTO checks VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            return grade_id

    def last_grade(self, week: str) -> GradeResult | None:
        with closing(self._connect()) as db:
            row = db.execute("SELECT result_json FROM grades WHERE week = ? ORDER BY id DESC LIMIT 1",
                             (week,)).fetchone()
        return GradeResult.from_dict(json.loads(row[0])) if row else None

    def weeks_summary(self) -> dict[str, dict]:
        """Per graded week: attempts, ever complete, ever verified on GPU."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT week, COUNT(*), MAX(complete), MAX(verified_on_gpu) FROM grades GROUP BY week")
            return {w: {"attempts": n, "passed": bool(c), "verified_on_gpu": bool(v)} for w, n, c, v in rows}

    # ------------------------------------------------------------ hints
    def next_hint_index(self, week: str, available: int) -> int:
        """Reveal one more hint (capped at `available`); returns how many are now shown."""
        with closing(self._connect()) as db, db:
            row = db.execute("SELECT shown FROM hints WHERE week = ?", (week,)).fetchone()
            shown = min((row[0] if row else 0) + 1, available)
            db.execute("INSERT INTO hints VALUES (?, ?) ON CONFLICT(week) DO UPDATE SET shown = excluded.shown",
                       (week, shown))
            return shown


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")
