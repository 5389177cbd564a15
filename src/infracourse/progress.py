"""The learner's progress database: the one owner of `<workspace>/.infracourse/progress.db`.

On-disk format (SQLite, `PRAGMA user_version` = SCHEMA_VERSION):
  unlocks(week PRIMARY KEY, unlocked_at)
  grades(id, week, started_at, seconds, tier, device, fingerprint, complete, verified_on_gpu, result_json)
  checks(grade_id, check_id, status, message, value, target, unit)   one row per check of a grade
  hints(week PRIMARY KEY, shown)                                       how many hints were revealed
  drill_answers(id, question, seed, week, topic, mode, correct, reply, seconds, answered_at)
                                                    one row per drill answer (infracourse.drills)
  selftests(id, taken_at, result_json)              each start self-test: scores and the suggested weeks
(Tables are only ever added, with CREATE IF NOT EXISTS, so an older workspace gains them on first use.)
A partial grade (`grade --check`/`-k`) is a row like any other, with complete 0 and "partial": true in its
result_json: it never passes a week, and last_grade skips it.
A grade and all its checks are written in one transaction, so a Ctrl-C or a kill during grading leaves
every earlier result intact and never half a grade. WAL mode keeps readers off the writer's way.

Nothing is lost silently: after every write the database is copied (sqlite's online backup API, so the copy
is a consistent snapshot) to `progress.db.bak`. A missing or unreadable database is restored from that copy
and `notice` says so; without a copy the caller is told exactly what was lost (Workspace rebuilds what it can
from the week folders). A database that cannot be written is named as a permissions problem, never as corrupt.
"""
from __future__ import annotations

import errno
import json
import os
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
CREATE TABLE IF NOT EXISTS drill_answers (
    id INTEGER PRIMARY KEY AUTOINCREMENT, question TEXT NOT NULL, seed INTEGER NOT NULL, week TEXT NOT NULL,
    topic TEXT NOT NULL, mode TEXT NOT NULL, correct INTEGER NOT NULL, reply TEXT NOT NULL, seconds REAL NOT NULL,
    answered_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS selftests (id INTEGER PRIMARY KEY AUTOINCREMENT, taken_at TEXT NOT NULL,
    result_json TEXT NOT NULL);
"""


class ProgressError(Exception):
    """The progress database cannot be used; the message names the file and the fix."""


def permission_problem(path: Path) -> str | None:
    """Why `path` (or the folder that would hold it) cannot be written, or None when it can."""
    for target in (path, path.parent):
        if target.exists() and not os.access(target, os.W_OK):
            read_only_fs = _read_only_filesystem(target)
            what = "is on a read-only file system" if read_only_fs else "is not writable by you"
            fix = "work in a copy on a writable disk" if read_only_fs else f"fix with `chmod u+w {target}`"
            return f"permission problem: {target} {what} ({fix})"
    return None


def _read_only_filesystem(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class Progress:
    def __init__(self, path: Path, must_exist: bool = False):
        """Open (or create) the store. must_exist: the workspace had one, so a missing file is a loss to report
        (restored from the backup when there is one; otherwise `notice` says an empty one was started)."""
        self.path = path
        self.backup_path = path.with_name(path.name + ".bak")
        self.notice = ""  # one line for the learner when something had to be restored or rebuilt
        self.lost = False  # the database was missing or unreadable and no backup could replace it
        if problem := permission_problem(path):
            raise ProgressError(problem)
        if not path.exists() and must_exist:
            if self._restore():
                self.notice = f"{path} was missing: restored from its backup {self.backup_path.name}"
            else:
                self.lost = True
                self.notice = f"{path} was missing and had no backup: started an empty one"
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            if _permission_error(exc):
                raise ProgressError(permission_problem(path) or f"permission problem: {path}: {exc}") from None
            aside = self._move_aside()
            if self._restore():
                self.notice = (f"{path} was unreadable ({exc}); restored from its backup {self.backup_path.name}; "
                               f"the broken file is kept as {aside.name}")
                self._open()
                return
            os.replace(aside, path)  # nothing replaced it: leave the learner's file where it was
            raise ProgressError(
                f"{path} is not a readable progress database ({exc}) and has no backup ({self.backup_path.name}). "
                f"Move it aside (`mv {path} {path}.broken`) and run any infracourse command: your unlocks are "
                "rebuilt from the week folders and each week's last grade from weekNN/.grade/result.json; the "
                "attempt history and the count of hints shown are lost") from None

    def _open(self) -> None:
        with closing(self._connect()) as db, db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ProgressError(f"{self.path} was written by a newer infracourse (schema {version}); upgrade "
                                    "infracourse to use this workspace")
            db.executescript(SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    def _write(self):
        """A write transaction; on success the backup is refreshed."""
        return _BackedUpWrite(self)

    def backup(self) -> None:
        """Copy the database to progress.db.bak as one consistent snapshot (written aside, then renamed)."""
        tmp = self.backup_path.with_name(self.backup_path.name + ".tmp")
        try:
            with closing(sqlite3.connect(self.path, timeout=30)) as src, closing(sqlite3.connect(tmp)) as dst:
                src.backup(dst)
            os.replace(tmp, self.backup_path)
        except (OSError, sqlite3.Error):
            tmp.unlink(missing_ok=True)  # a failed backup never costs the grade that was just stored

    def _restore(self) -> bool:
        """Copy a readable backup into place; False when there is none."""
        if not self.backup_path.is_file():
            return False
        try:
            with closing(sqlite3.connect(f"file:{self.backup_path}?mode=ro", uri=True)) as src:
                if src.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                    return False
                with closing(sqlite3.connect(self.path)) as dst:
                    src.backup(dst)
            return True
        except sqlite3.Error:
            self.path.unlink(missing_ok=True)
            return False

    def _move_aside(self) -> Path:
        aside = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(self.path, aside)
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        return aside

    # ------------------------------------------------------------ unlocks
    def unlock(self, week: str) -> bool:
        """Record an unlock; False if the week was already unlocked."""
        with self._write() as db:
            cur = db.execute("INSERT OR IGNORE INTO unlocks VALUES (?, ?)", (week, _now()))
            return cur.rowcount == 1

    def unlocked(self) -> dict[str, str]:
        with closing(self._connect()) as db:
            return dict(db.execute("SELECT week, unlocked_at FROM unlocks"))

    # ------------------------------------------------------------ grades
    def record(self, result: GradeResult) -> int:
        """Store a grade and its checks atomically; returns the grade id."""
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO grades (week, started_at, seconds, tier, device, fingerprint, complete, verified_on_gpu,"
                " result_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (result.week, result.started_at, result.seconds, result.tier, result.device, result.fingerprint,
                 int(result.complete), int(result.verified_on_gpu), json.dumps(result.as_dict())))
            grade_id = cur.lastrowid
            rows = []
            for c in result.checks:
                head = c.headline
                rows.append((grade_id, c.id, c.status, c.message, head and head.value, head and head.target,
                             head and head.unit))
            db.executemany("INSERT INTO checks VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            return grade_id

    def last_grade(self, week: str) -> GradeResult | None:
        """The week's last whole grade: a partial one (`grade --check`) is stored, marked partial in its
        result_json, but never stands for the week (status, completion, submit)."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT result_json FROM grades WHERE week = ? AND NOT coalesce(json_extract(result_json, "
                             "'$.partial'), 0) ORDER BY id DESC LIMIT 1", (week,)).fetchone()
        return GradeResult.from_dict(json.loads(row[0])) if row else None

    def weeks_summary(self) -> dict[str, dict]:
        """Per graded week: attempts, ever complete, ever verified on GPU."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT week, COUNT(*), MAX(complete), MAX(verified_on_gpu) FROM grades GROUP BY week")
            return {w: {"attempts": n, "passed": bool(c), "verified_on_gpu": bool(v)} for w, n, c, v in rows}

    # ------------------------------------------------------------ hints
    def next_hint_index(self, week: str, available: int) -> int:
        """Reveal one more hint (capped at `available`); returns how many are now shown."""
        with self._write() as db:
            row = db.execute("SELECT shown FROM hints WHERE week = ?", (week,)).fetchone()
            shown = min((row[0] if row else 0) + 1, available)
            db.execute("INSERT INTO hints VALUES (?, ?) ON CONFLICT(week) DO UPDATE SET shown = excluded.shown",
                       (week, shown))
            return shown

    # ------------------------------------------------------------ drills and the start self-test
    def record_drill(self, question: str, seed: int, week: str, topic: str, mode: str, correct: bool, reply: str,
                     seconds: float) -> None:
        with self._write() as db:
            db.execute("INSERT INTO drill_answers (question, seed, week, topic, mode, correct, reply, seconds, "
                       "answered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (question, seed, week, topic, mode, int(correct), reply[:200], seconds, _now()))

    def drill_history(self) -> list[dict]:
        """Every drill answer, oldest first."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT question, seed, week, topic, mode, correct, seconds, answered_at "
                              "FROM drill_answers ORDER BY id")
            keys = ("question", "seed", "week", "topic", "mode", "correct", "seconds", "answered_at")
            return [dict(zip(keys, row)) | {"correct": bool(row[5])} for row in rows]

    def record_selftest(self, result: dict) -> None:
        with self._write() as db:
            db.execute("INSERT INTO selftests (taken_at, result_json) VALUES (?, ?)", (_now(), json.dumps(result)))

    def last_selftest(self) -> dict | None:
        with closing(self._connect()) as db:
            row = db.execute("SELECT taken_at, result_json FROM selftests ORDER BY id DESC LIMIT 1").fetchone()
        return json.loads(row[1]) | {"taken_at": row[0]} if row else None


class _BackedUpWrite:
    """`with progress._write() as db:` one transaction, committed (or rolled back) and closed, then backed up."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def __enter__(self) -> sqlite3.Connection:
        self.db = self.progress._connect()
        return self.db

    def __exit__(self, kind, value, tb) -> None:
        failure = value
        try:
            self.db.commit() if kind is None else self.db.rollback()
        except sqlite3.DatabaseError as exc:
            failure = failure or exc
        finally:
            self.db.close()
        if failure is None:
            self.progress.backup()
        elif isinstance(failure, sqlite3.DatabaseError) and _permission_error(failure):
            raise ProgressError(permission_problem(self.progress.path) or
                                f"permission problem: {self.progress.path}: {failure}") from None
        elif failure is not value:
            raise failure


def _permission_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text or \
        getattr(exc, "sqlite_errorcode", None) in (8, 14) or getattr(exc, "errno", None) in (errno.EACCES, errno.EROFS)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")
