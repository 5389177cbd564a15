"""The instructor's gradebook: one SQLite file, the one owner of what a cohort handed in and how it graded.

On-disk format (`PRAGMA user_version` = SCHEMA_VERSION):
  meta(key, value)                 course title, created_at, pseudonym_key (for `publish --pseudonyms`)
  submissions(id, bundle_id UNIQUE, learner, week, submitted_at, imported_at, source, infracourse_version,
              graders_sha256, manifest_json, bundle)        the bundle's zip is kept, byte for byte
  results(id, submission_id, origin 'self'|'verified', graded_at, tier, device, fingerprint, passed, total,
          complete, verified_on_gpu, environment_json, ceilings_json, disagreements_json, result_json)
          'self' comes from the bundle; 'verified' from `cohort regrade` on the instructor's machine
  figures(result_id, check_id, name, value, unit, normalised)   performance figures, normalised by the
          ceilings of the device that measured them (cohort.performance)
Every change is one transaction: an import is all of its accepted bundles or nothing, a regrade result is
whole or absent, so a crash or kill -9 at any moment leaves the gradebook as it was before that change.
"""
from __future__ import annotations

import json
import secrets
import sqlite3
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from infracourse.cohort.bundle import Bundle, BundleError, read_bundle
from infracourse.cohort.performance import MEASURED, normalised
from infracourse.course import Course
from infracourse.grading.results import GradeResult

SCHEMA_VERSION = 1
DEFAULT_FILE = "gradebook.db"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS submissions (
    id INTEGER PRIMARY KEY, bundle_id TEXT NOT NULL UNIQUE, learner TEXT NOT NULL, week TEXT NOT NULL,
    submitted_at TEXT NOT NULL, imported_at TEXT NOT NULL, source TEXT NOT NULL, infracourse_version TEXT NOT NULL,
    graders_sha256 TEXT NOT NULL, manifest_json TEXT NOT NULL, bundle BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS submissions_by_week ON submissions (week, learner, submitted_at);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY, submission_id INTEGER NOT NULL REFERENCES submissions(id),
    origin TEXT NOT NULL CHECK (origin IN ('self', 'verified')), graded_at TEXT NOT NULL, tier TEXT NOT NULL,
    device TEXT NOT NULL, fingerprint TEXT NOT NULL, passed INTEGER NOT NULL, total INTEGER NOT NULL,
    complete INTEGER NOT NULL, verified_on_gpu INTEGER NOT NULL, environment_json TEXT NOT NULL,
    ceilings_json TEXT, disagreements_json TEXT NOT NULL, result_json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS results_by_submission ON results (submission_id, origin, id);
CREATE TABLE IF NOT EXISTS figures (
    result_id INTEGER NOT NULL REFERENCES results(id), check_id TEXT NOT NULL, name TEXT NOT NULL,
    value REAL NOT NULL, unit TEXT NOT NULL, normalised REAL, PRIMARY KEY (result_id, check_id, name));
"""

OnBundle = Callable[[str, "BundleError | None"], None]


class GradebookError(Exception):
    """The gradebook cannot be used; the message names the file and the fix."""


@dataclass
class ImportReport:
    imported: list[Bundle] = field(default_factory=list)
    rejected: list[BundleError] = field(default_factory=list)
    committed: bool = False  # False: the gradebook is exactly as it was before


@dataclass(frozen=True)
class Submission:
    id: int
    learner: str
    week: str
    submitted_at: str
    source: str


class Gradebook:
    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise GradebookError(f"no gradebook at {self.path}: run `infracourse cohort init` in that folder "
                                 "(or pass --gradebook FILE)")
        try:
            with closing(self._connect()) as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise GradebookError(f"{self.path} is not a gradebook ({exc}); point --gradebook at the file "
                                 "`infracourse cohort init` made") from None
        if version != SCHEMA_VERSION or "submissions" not in tables:
            raise GradebookError(f"{self.path} is not a gradebook of this infracourse (schema {version}, expected "
                                 f"{SCHEMA_VERSION}); use the infracourse version that made it")

    @classmethod
    def create(cls, path: Path, course: Course) -> "Gradebook":
        """Make an empty gradebook at `path` (an existing one is opened as it is)."""
        path = Path(path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".part")
            part.unlink(missing_ok=True)
            with closing(sqlite3.connect(part)) as db, db:
                db.executescript(SCHEMA)
                db.executemany("INSERT INTO meta VALUES (?, ?)", [
                    ("course", course.syllabus.title), ("created_at", _now()),
                    ("pseudonym_key", secrets.token_hex(16))])
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            part.replace(path)  # a gradebook exists whole or not at all
        return cls(path)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)  # transactions are explicit below
        db.execute("PRAGMA foreign_keys = ON")
        return db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE .. COMMIT; an exception, or the caller's ROLLBACK, leaves nothing behind."""
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            if db.in_transaction:
                db.execute("COMMIT")

    def meta(self, key: str) -> str | None:
        with closing(self._connect()) as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    # ------------------------------------------------------------ import
    def import_bundles(self, paths: Iterable[Path], course: Course, *, keep_going: bool = False,
                       on_bundle: OnBundle | None = None) -> ImportReport:
        """Validate each bundle and record the good ones in one transaction.

        Any rejection leaves the gradebook exactly as it was, unless `keep_going`: then the valid bundles
        are recorded and the rejected ones only reported."""
        report = ImportReport()
        imported_at = _now()
        with self._transaction() as db:
            known = {b: (s, t) for b, s, t in db.execute("SELECT bundle_id, source, imported_at FROM submissions")}
            for path in paths:
                problem = None
                try:
                    bundle = read_bundle(Path(path), course)
                    if bundle.bundle_id in known:
                        source, when = known[bundle.bundle_id]
                        raise BundleError(path, "duplicate", f"the same submission was already imported from {source}"
                                          + (f" at {when}" if when else " earlier in this import")
                                          + "; leave this copy out")
                    _insert(db, bundle, imported_at)
                    known[bundle.bundle_id] = (bundle.source, "")
                    report.imported.append(bundle)
                except BundleError as exc:
                    problem = exc
                    report.rejected.append(exc)
                if on_bundle:
                    on_bundle(str(path), problem)
            if report.rejected and not keep_going:
                db.execute("ROLLBACK")
        report.committed = bool(report.imported) and (keep_going or not report.rejected)
        return report

    # ------------------------------------------------------------ regrade
    def latest_submissions(self, *, week: str | None = None, learner: str | None = None) -> list[Submission]:
        """The newest submission of each learner x week (what export and regrade consider)."""
        query = ("SELECT id, learner, week, submitted_at, source FROM submissions s WHERE id = (SELECT id FROM "
                 "submissions t WHERE t.learner = s.learner AND t.week = s.week ORDER BY submitted_at DESC, id DESC "
                 "LIMIT 1)")
        args: list = []
        for column, value in (("week", week), ("learner", learner)):
            if value is not None:
                query += f" AND {column} = ?"
                args.append(value)
        with closing(self._connect()) as db:
            rows = db.execute(query + " ORDER BY week, learner", args).fetchall()
        return [Submission(*row) for row in rows]

    def bundle_data(self, submission_id: int) -> bytes:
        with closing(self._connect()) as db:
            return db.execute("SELECT bundle FROM submissions WHERE id = ?", (submission_id,)).fetchone()[0]

    def results_of(self, submission_id: int, origin: str) -> list[tuple[str, GradeResult]]:
        """(fingerprint, result) of each result of that origin, oldest first."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT fingerprint, result_json FROM results WHERE submission_id = ? AND origin = ? "
                              "ORDER BY id", (submission_id, origin)).fetchall()
        return [(fp, GradeResult.from_dict(json.loads(data))) for fp, data in rows]

    def record_verified(self, submission_id: int, result: GradeResult, environment: dict, ceilings: dict | None,
                        disagreements: list[dict]) -> None:
        """Store the instructor's regrade of a submission, whole (one transaction)."""
        with self._transaction() as db:
            _insert_result(db, submission_id, "verified", result, environment, ceilings, disagreements)

    def unsandboxed(self) -> set[tuple[str, str]]:
        """(learner, week) whose newest submission's newest verified result ran without the sandboxed worker
        (`cohort regrade --allow-unsandboxed`): its learner code could have forged it."""
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT s.learner, s.week, json_extract(r.result_json, '$.sandboxed') FROM submissions s "
                "JOIN results r ON r.id = (SELECT id FROM results WHERE submission_id = s.id AND origin = 'verified' "
                "ORDER BY id DESC LIMIT 1)").fetchall()
        return {(learner, week) for learner, week, sandboxed in rows if sandboxed == 0}

    # ------------------------------------------------------------ reading it all (export, publish)
    def snapshot(self) -> dict[str, list[tuple]]:
        """Every submission, result and figure, read in one consistent transaction (no bundles, no JSON blobs)."""
        with closing(self._connect()) as db:
            db.execute("BEGIN")
            snap = {
                "submissions": db.execute("SELECT id, learner, week, submitted_at, graders_sha256 FROM submissions "
                                          "ORDER BY id").fetchall(),
                "results": db.execute("SELECT id, submission_id, origin, tier, device, passed, total, complete, "
                                      "verified_on_gpu, disagreements_json FROM results ORDER BY id").fetchall(),
                "figures": db.execute("SELECT result_id, check_id, name, value, unit, normalised FROM figures "
                                      "ORDER BY result_id, check_id, name").fetchall(),
            }
            db.execute("COMMIT")
        return snap


def _insert(db: sqlite3.Connection, bundle: Bundle, imported_at: str) -> None:
    m = bundle.manifest
    cur = db.execute(
        "INSERT INTO submissions (bundle_id, learner, week, submitted_at, imported_at, source, infracourse_version, "
        "graders_sha256, manifest_json, bundle) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (bundle.bundle_id, m.learner, m.week, m.created_at, imported_at, bundle.source, m.infracourse_version,
         m.graders_sha256, m.model_dump_json(), bundle.data))
    _insert_result(db, cur.lastrowid, "self", bundle.results, m.environment, m.ceilings, [], bundle.results_json)


def _insert_result(db: sqlite3.Connection, submission_id: int, origin: str, result: GradeResult, environment: dict,
                   ceilings: dict | None, disagreements: list[dict], result_json: str | None = None) -> None:
    cur = db.execute(
        "INSERT INTO results (submission_id, origin, graded_at, tier, device, fingerprint, passed, total, complete, "
        "verified_on_gpu, environment_json, ceilings_json, disagreements_json, result_json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (submission_id, origin, result.started_at, result.tier, result.device, result.fingerprint,
         result.count("passed"), len(result.checks), int(result.complete), int(result.verified_on_gpu),
         json.dumps(environment), json.dumps(ceilings) if ceilings else None, json.dumps(disagreements),
         result_json or json.dumps(result.as_dict())))
    rows = [(cur.lastrowid, c.id, name, float(f["value"]), str(f.get("unit") or ""), normalised(f, ceilings))
            for c in result.checks if c.kind == "performance" and c.status in MEASURED
            for name, f in c.figures.items() if isinstance(f, dict) and _finite(f.get("value"))]
    db.executemany("INSERT INTO figures VALUES (?, ?, ?, ?, ?, ?)", rows)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and abs(value) != float("inf")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
