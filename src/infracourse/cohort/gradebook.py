"""The instructor's gradebook: one SQLite file, the one owner of what a cohort handed in and how it graded.

On-disk format (`PRAGMA user_version` = SCHEMA_VERSION; a version-1 gradebook is migrated when opened):
  meta(key, value)                 course title, created_at, pseudonym_key (for `publish --pseudonyms`)
  roster(learner PRIMARY KEY, name, email, sis_user_id, sis_login_id, section, canvas_id, idnumber, secret,
         added_at)                 who is enrolled and the key their bundles are signed with (cohort.roster)
  submissions(id, bundle_id UNIQUE, learner, week, submitted_at, imported_at, source, infracourse_version,
              graders_sha256, manifest_json, bundle, received_at, signed)   the bundle's zip is kept, byte
              for byte; `submitted_at` is the learner's claim, `received_at` the gradebook's own clock (or
              the instructor's `--received-at`): only the latter orders submissions and judges lateness;
              `signed` 1 when the bundle's signature was checked against the roster; the track of a project
              week (22-24) is read from `manifest_json` (`$.track`, signed with the rest), so needs no column
  results(id, submission_id, origin 'self'|'verified', graded_at, tier, device, fingerprint, passed, total,
          complete, verified_on_gpu, environment_json, ceilings_json, disagreements_json, result_json)
          'self' comes from the bundle; 'verified' from `cohort regrade` on the instructor's machine
  figures(result_id, check_id, name, value, unit, normalised)   performance figures, normalised by the
          ceilings of the device that measured them (cohort.performance)
  scores(id, submission_id, reviewer, item, points, comment, scored_at, replaces)   rubric scores given by hand
          in `cohort review`, append-only: a changed score is a new row naming the one it `replaces`, so the old
          one stays (the audit trail); a reviewer's current score of an item is their newest row for it
Every change is one transaction: an import is all of its accepted bundles or nothing, a regrade result is
whole or absent, so a crash or kill -9 at any moment leaves the gradebook as it was before that change.
An import streams: one bundle is read, checked and written at a time (SQLite spills the open transaction
to disk), so its memory does not grow with the number of bundles.
"""
from __future__ import annotations

import io
import json
import secrets
from collections import deque
import sqlite3
import time
import zipfile
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from infracourse.cohort.bundle import Bundle, BundleError, check_claims, lab_of, read_bundle
from infracourse.cohort.performance import MEASURED, normalised
from infracourse.cohort.roster import Learner, new_key
from infracourse.course import Course
from infracourse.drills import record
from infracourse.grading.results import GradeResult

SCHEMA_VERSION = 3
DEFAULT_FILE = "gradebook.db"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS submissions (
    id INTEGER PRIMARY KEY, bundle_id TEXT NOT NULL UNIQUE, learner TEXT NOT NULL, week TEXT NOT NULL,
    submitted_at TEXT NOT NULL, imported_at TEXT NOT NULL, source TEXT NOT NULL, infracourse_version TEXT NOT NULL,
    graders_sha256 TEXT NOT NULL, manifest_json TEXT NOT NULL, bundle BLOB NOT NULL, received_at TEXT NOT NULL,
    signed INTEGER NOT NULL DEFAULT 0);
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
""" + """
CREATE TABLE IF NOT EXISTS roster (
    learner TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL, sis_user_id TEXT NOT NULL,
    sis_login_id TEXT NOT NULL, section TEXT NOT NULL, canvas_id TEXT NOT NULL, idnumber TEXT NOT NULL,
    secret TEXT NOT NULL, added_at TEXT NOT NULL);
"""
SCORES_TABLE = """
CREATE TABLE IF NOT EXISTS scores (
    id INTEGER PRIMARY KEY, submission_id INTEGER NOT NULL REFERENCES submissions(id), reviewer TEXT NOT NULL,
    item TEXT NOT NULL, points INTEGER NOT NULL, comment TEXT NOT NULL, scored_at TEXT NOT NULL,
    replaces INTEGER REFERENCES scores(id));
CREATE INDEX IF NOT EXISTS scores_by_submission ON scores (submission_id, reviewer, item, id);
"""
SCHEMA += SCORES_TABLE
MIGRATIONS = {  # from version N to N + 1, run in one transaction when an older gradebook is opened
    1: """
ALTER TABLE submissions ADD COLUMN received_at TEXT NOT NULL DEFAULT '';
UPDATE submissions SET received_at = imported_at;
ALTER TABLE submissions ADD COLUMN signed INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS roster (
    learner TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL, sis_user_id TEXT NOT NULL,
    sis_login_id TEXT NOT NULL, section TEXT NOT NULL, canvas_id TEXT NOT NULL, idnumber TEXT NOT NULL,
    secret TEXT NOT NULL, added_at TEXT NOT NULL);
""",
    2: SCORES_TABLE,
}
ROSTER_FIELDS = ("name", "email", "sis_user_id", "sis_login_id", "section", "canvas_id", "idnumber")

OnBundle = Callable[[str, "BundleError | None"], None]


class GradebookError(Exception):
    """The gradebook cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class Imported:
    """What the report keeps of an imported bundle (not its bytes: an import of any size fits in memory)."""
    source: str
    learner: str
    week: str
    signed: bool


@dataclass
class ImportReport:
    imported: list[Imported] = field(default_factory=list)
    rejected: list[BundleError] = field(default_factory=list)
    committed: bool = False  # False: the gradebook is exactly as it was before


@dataclass(frozen=True)
class Submission:
    id: int
    learner: str
    week: str
    submitted_at: str
    source: str
    track: str | None = None  # a project week's (22-24) track, from the signed manifest; None for weeks 1-21


@dataclass(frozen=True)
class Score:
    """One rubric score a reviewer gave (a row of `scores`); `replaces` is the id of the one it changed."""
    id: int
    submission_id: int
    reviewer: str
    item: str
    points: int
    comment: str
    scored_at: str
    replaces: int | None


class ScoreConflict(Exception):
    """The reviewer's score changed since they loaded it (another tab of theirs); `current` is the newer one."""

    def __init__(self, current: Score | None):
        super().__init__("this score was changed in another window since you loaded it: reload to see it")
        self.current = current


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
        if not (1 <= version <= SCHEMA_VERSION) or "submissions" not in tables:
            raise GradebookError(f"{self.path} is not a gradebook of this infracourse (schema {version}, expected "
                                 f"{SCHEMA_VERSION}); use the infracourse version that made it")
        if version < SCHEMA_VERSION:
            self._migrate()

    def _migrate(self) -> None:
        """Bring an older gradebook to SCHEMA_VERSION in one transaction (a kill leaves the old one)."""
        with self._transaction() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]  # re-read under the lock
            while version < SCHEMA_VERSION:
                for statement in filter(str.strip, MIGRATIONS[version].split(";")):
                    db.execute(statement)
                version += 1
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

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

    def _connect(self, busy_s: float = 30) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=busy_s, isolation_level=None)  # transactions are explicit below
        db.execute("PRAGMA foreign_keys = ON")
        return db

    @contextmanager
    def _transaction(self, busy_s: float = 30) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE .. COMMIT; an exception, or the caller's ROLLBACK, leaves nothing behind."""
        with closing(self._connect(busy_s)) as db:
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

    # ------------------------------------------------------------ roster
    def import_roster(self, learners: list[Learner]) -> tuple[int, int]:
        """Add new learners (each issued a secret) and update the details of known ones; a learner's secret
        never changes here. Returns (added, updated)."""
        added = updated = 0
        with self._transaction() as db:
            for learner in learners:
                details = tuple(getattr(learner, f) for f in ROSTER_FIELDS)
                if db.execute("SELECT 1 FROM roster WHERE learner = ?", (learner.id,)).fetchone():
                    db.execute(f"UPDATE roster SET {', '.join(f + ' = ?' for f in ROSTER_FIELDS)} WHERE learner = ?",
                               (*details, learner.id))
                    updated += 1
                else:
                    db.execute(f"INSERT INTO roster (learner, {', '.join(ROSTER_FIELDS)}, secret, added_at) VALUES "
                               f"({', '.join('?' * (len(ROSTER_FIELDS) + 3))})", (learner.id, *details, new_key(), _now()))
                    added += 1
        return added, updated

    def roster(self) -> list[tuple[Learner, str]]:
        """(learner, secret key hex) of everyone on the roster, by id."""
        with closing(self._connect()) as db:
            rows = db.execute(f"SELECT learner, {', '.join(ROSTER_FIELDS)}, secret FROM roster ORDER BY learner")
            return [(Learner(*row[:-1]), row[-1]) for row in rows]

    # ------------------------------------------------------------ import
    def import_bundles(self, paths: Iterable[Path], course: Course, *, keep_going: bool = False,
                       on_bundle: OnBundle | None = None, received_at: str | None = None,
                       require_roster: bool = False, jobs: int = 1) -> ImportReport:
        """Validate each bundle and record the good ones in one transaction, streaming (one bundle in memory
        at a time; `paths` may be a generator).

        With a roster, a bundle is refused unless its learner is on it and it is signed with that learner's
        secret; without one, ids are taken as claimed (`require_roster` refuses that). Self-reported results
        no grader could produce are refused (`bundle.check_claims`). `received_at` (UTC, ISO 8601; default:
        now) is recorded as when the gradebook received the batch. Any rejection leaves the gradebook exactly
        as it was, unless `keep_going`: then the valid bundles are recorded and the rejected ones only
        reported. `jobs` > 1 reads and checks bundles in that many processes while this one writes."""
        report = ImportReport()
        imported_at = _now()
        received_at = received_at or imported_at
        with closing(self._connect()) as db:
            keys = {who: bytes.fromhex(key) for who, key in db.execute("SELECT learner, secret FROM roster")}
        if require_roster and not keys:
            raise GradebookError(f"{self.path} has no roster, so the learner ids in bundles cannot be checked: "
                                 "run `infracourse cohort roster import ROSTER.csv` and send each learner their "
                                 "secret first (or pass --unsigned to accept ids as claimed)")
        checker = Checker(course, keys)
        with _validated(paths, checker, jobs) as checked, self._transaction() as db:
            before = db.execute("SELECT COALESCE(MAX(id), 0) FROM submissions").fetchone()[0]
            for path, bundle in checked:
                problem = None
                try:
                    if isinstance(bundle, BundleError):
                        raise bundle
                    seen = db.execute("SELECT id, source, imported_at FROM submissions WHERE bundle_id = ?",
                                      (bundle.bundle_id,)).fetchone()
                    if seen:
                        raise BundleError(path, "duplicate", f"the same submission was already imported from {seen[1]}"
                                          + (" earlier in this import" if seen[0] > before else f" at {seen[2]}")
                                          + "; leave this copy out")
                    m = bundle.manifest
                    _insert(db, bundle, imported_at, received_at, signed=bool(keys))
                    report.imported.append(Imported(bundle.source, m.learner, m.week, bool(keys)))
                    del bundle, m
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
        query = ("SELECT id, learner, week, received_at, source, json_extract(manifest_json, '$.track') "
                 "FROM submissions s WHERE id = (SELECT id FROM "
                 "submissions t WHERE t.learner = s.learner AND t.week = s.week ORDER BY received_at DESC, "
                 "submitted_at DESC, id DESC LIMIT 1)")
        args: list = []
        for column, value in (("week", week), ("learner", learner)):
            if value is not None:
                query += f" AND {column} = ?"
                args.append(value)
        with closing(self._connect()) as db:
            rows = db.execute(query + " ORDER BY week, learner", args).fetchall()
        return [Submission(*row) for row in rows]

    def drill_records(self) -> Iterator[tuple[str, dict]]:
        """(learner, drill record) from each learner's newest submission that carries one (bundles written
        before `drills.json` existed carry none and are passed over); one bundle in memory at a time."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT learner, bundle FROM submissions ORDER BY learner, received_at DESC, "
                              "submitted_at DESC, id DESC")
            done = None
            for learner, data in rows:
                if learner == done:
                    continue
                with zipfile.ZipFile(io.BytesIO(data)) as zf:
                    if record.FILE not in zf.namelist():
                        continue
                    found = record.parse(zf.read(record.FILE))  # checked at import: refused bundles are not here
                done = learner
                yield learner, found

    def drill_accuracy(self) -> dict:
        """Per-topic drill accuracy across the cohort (`infracourse.drills.record.cohort`)."""
        return record.cohort(self.drill_records())

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

    # ------------------------------------------------------------ rubric scores (cohort.review)
    def submission(self, submission_id: int) -> Submission | None:
        """One submission by id, newest or not (None: no such submission in this gradebook)."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT id, learner, week, received_at, source, json_extract(manifest_json, '$.track') "
                             "FROM submissions WHERE id = ?", (submission_id,)).fetchone()
        return Submission(*row) if row else None

    def scores(self, submission_id: int | None = None) -> list[Score]:
        """Every score given (of one submission, or all), oldest first: the whole audit trail."""
        where, args = ("WHERE submission_id = ?", (submission_id,)) if submission_id is not None else ("", ())
        with closing(self._connect()) as db:
            rows = db.execute(f"SELECT {', '.join(Score.__dataclass_fields__)} FROM scores {where} ORDER BY id",
                              args).fetchall()
        return [Score(*row) for row in rows]

    def record_score(self, submission_id: int, reviewer: str, item: str, points: int, comment: str, *,
                     base: int | None, busy_s: float = 30) -> Score:
        """Add `reviewer`'s score of `item`, replacing their current one, only if that is still `base` (the id
        of the score they last saw; None: they saw none). Otherwise ScoreConflict carries the newer score, and
        nothing is written: two tabs of one reviewer never overwrite each other unseen. Other reviewers' rows
        are their own, so reviewers never conflict. GradebookError when another writer (an import, a regrade)
        holds the gradebook past `busy_s`."""
        try:
            with self._transaction(busy_s) as db:
                if not db.execute("SELECT 1 FROM submissions WHERE id = ?", (submission_id,)).fetchone():
                    raise GradebookError(f"{self.path} has no submission {submission_id}")
                current = db.execute("SELECT id FROM scores WHERE submission_id = ? AND reviewer = ? AND item = ? "
                                     "ORDER BY id DESC LIMIT 1", (submission_id, reviewer, item)).fetchone()
                if (current[0] if current else None) != base:
                    newer = db.execute(f"SELECT {', '.join(Score.__dataclass_fields__)} FROM scores WHERE id = ?",
                                       (current[0],)).fetchone() if current else None
                    raise ScoreConflict(Score(*newer) if newer else None)
                score = Score(0, submission_id, reviewer, item, points, comment, _now(), base)
                fields = list(Score.__dataclass_fields__)[1:]
                cur = db.execute(f"INSERT INTO scores ({', '.join(fields)}) VALUES ({', '.join('?' * len(fields))})",
                                 [getattr(score, f) for f in fields])
                return Score(cur.lastrowid, *[getattr(score, f) for f in fields])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            raise GradebookError(f"{self.path} is being written by another command (an import or a regrade) for over "
                                 f"{busy_s:g} s; the score was not saved: save it again when that command ends") from None

    # ------------------------------------------------------------ reading it all (export, publish)
    def snapshot(self) -> dict[str, list[tuple]]:
        """Every submission, result and figure, read in one consistent transaction (no bundles, no JSON blobs)."""
        with closing(self._connect()) as db:
            db.execute("BEGIN")
            snap = {
                # received_at is the time a submission counts from; the learner's claimed time comes after
                "submissions": db.execute("SELECT id, learner, week, received_at, graders_sha256, submitted_at, "
                                          "signed FROM submissions ORDER BY id").fetchall(),
                "roster": [r[0] for r in db.execute("SELECT learner FROM roster ORDER BY learner")],
                "results": db.execute("SELECT id, submission_id, origin, tier, device, passed, total, complete, "
                                      "verified_on_gpu, disagreements_json FROM results ORDER BY id").fetchall(),
                "figures": db.execute("SELECT result_id, check_id, name, value, unit, normalised FROM figures "
                                      "ORDER BY result_id, check_id, name").fetchall(),
                # submission id -> track, for project weeks (22-24) only
                "tracks": dict(db.execute("SELECT id, json_extract(manifest_json, '$.track') FROM submissions "
                                          "WHERE json_extract(manifest_json, '$.track') IS NOT NULL").fetchall()),
            }
            db.execute("COMMIT")
        return snap


class Checker:
    """Everything an import checks of one bundle on its own (the rest needs the gradebook: duplicates)."""

    def __init__(self, course: Course, keys: dict[str, bytes]):
        self.course, self.keys, self.checks = course, keys, {}

    def __call__(self, path) -> tuple[object, "Bundle | BundleError"]:
        try:
            bundle = read_bundle(Path(path), self.course)
            m = bundle.manifest
            if self.keys:
                key = self.keys.get(m.learner)
                if key is None:
                    raise BundleError(path, "unknown-learner", f"learner {m.learner!r} is not on the roster: add "
                                      "them (`cohort roster import`) and send them their secret, or ask them to "
                                      "submit under their roster id")
                if not m.signed_by(key):
                    raise BundleError(path, "signature", f"not signed with {m.learner!r}'s secret ("
                                      + ("unsigned" if m.signature is None else "the signature does not match")
                                      + "): it was made without that learner's secret or changed after signing; "
                                      "ask the learner to run `infracourse submit WEEK --secret-file THEIR.secret` "
                                      "and send the new .zip unchanged")
            if (m.week, m.track) not in self.checks:  # a project week: the track's project staged for it
                self.checks[m.week, m.track] = {c.id for c in lab_of(self.course, m.week, m.track).spec.checks}
            check_claims(bundle, self.checks[m.week, m.track])
            return path, bundle
        except BundleError as exc:
            return path, exc


_CHECKER: Checker | None = None  # in each validating process


def _init_checker(root: Path, keys: dict[str, bytes]) -> None:
    global _CHECKER
    _CHECKER = Checker(Course(root), keys)


def _check(path):
    return _CHECKER(path)


@contextmanager
def _validated(paths: Iterable, checker: Checker, jobs: int) -> Iterator[Iterator[tuple]]:
    """(path, Bundle or BundleError) in the order of `paths`. With jobs > 1, processes read and check ahead
    of the caller, at most WINDOW bundles at a time, so memory stays bounded whatever the number of paths."""
    if jobs <= 1:
        yield map(checker, paths)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("forkserver"), initializer=_init_checker,
                             initargs=(checker.course.root, checker.keys)) as pool:
        def ordered():
            pending = deque()
            for path in paths:
                pending.append(pool.submit(_check, path))
                if len(pending) >= WINDOW:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        yield ordered()


WINDOW = 64


def _insert(db: sqlite3.Connection, bundle: Bundle, imported_at: str, received_at: str, *, signed: bool) -> None:
    m = bundle.manifest
    cur = db.execute(
        "INSERT INTO submissions (bundle_id, learner, week, submitted_at, imported_at, source, infracourse_version, "
        "graders_sha256, manifest_json, bundle, received_at, signed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (bundle.bundle_id, m.learner, m.week, m.created_at, imported_at, bundle.source, m.infracourse_version,
         m.graders_sha256, m.model_dump_json(), bundle.data, received_at, int(signed)))
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
    rows = [(cur.lastrowid, c.id, name, f.value, f.unit, normalised(f, ceilings))
            for c in result.checks if c.kind == "performance" and c.status in MEASURED
            for name, f in c.figures.items()]
    db.executemany("INSERT INTO figures VALUES (?, ?, ?, ?, ?, ?)", rows)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
