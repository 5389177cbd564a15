"""A submission bundle: what `infracourse submit weekNN` writes and what `infracourse cohort import` reads.

Layout of `<workspace>/submissions/weekNN-<UTC timestamp>.zip` (format_version 2; 1 is read, unsigned):
  manifest.json    `Manifest`: learner, week, the track of a project week (22-24; absent for the others),
                   versions, device + environment, calibrated ceilings, the
                   sha256 and size of every other member, and `signature`: HMAC-SHA256 under the learner's
                   secret (issued by the instructor, `cohort.roster`) over all of the above, so neither the
                   learner id nor any file can be changed without that secret
  results.json     the learner's last grade of the week (`GradeResult.as_dict()`): self-reported
  drills.json      the learner's drill record, per topic (`infracourse.drills.record`); absent when they
                   have answered no drill, and from bundles written before it existed: "no record"
  files/<name>     the week folder as the grader sees it (caches, backups and plots left out)

`read_bundle` trusts nothing in a bundle: size, zip structure, member names, manifest, hashes, week and
results are checked in that order, and the first fault becomes a `BundleError` naming the file, what is
wrong and what to do. Duplicates and signatures are the gradebook's to check (it holds what was imported and
the roster's secrets); `check_claims` refuses self-reported results no grader could have produced.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import math
import json
import os
import stat
import time
import zipfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Collection, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from infracourse import __version__
from infracourse.cohort.roster import LEARNER_ID, RosterError, parse_secret
from infracourse.course import Course, LabDir
from infracourse.drills import record as drill_record
from infracourse.grading.results import GradeResult
from infracourse.grading.runner import IGNORED
from infracourse.hardware import Hardware, cached_ceilings, detect
from infracourse.syllabus import WEEK_ID
from infracourse.workspace import Workspace

FORMAT_VERSION = 2  # 2: signed
MANIFEST = "manifest.json"
RESULTS = "results.json"
FILES = "files/"
MAX_BUNDLE_BYTES = 16 * 2**20  # the zip as stored
MAX_UNPACKED_BYTES = 64 * 2**20  # all members unpacked: a zip bomb stops here
MAX_MEMBERS = 1000
NONNEGATIVE_UNITS = {"s", "ms", "us", "µs", "ns", "GB/s", "TFLOP/s", "samples/s", "tokens/s", "B", "%"}
MAX_FRACTION_OF_CEILING = 1.5  # past the device's calibrated ceiling by half: no kernel does that, a forgery does
SHA256 = r"^[0-9a-f]{64}$"
_GRADE = TypeAdapter(GradeResult)  # types and statuses of results.json, checked field by field
RESEND = "ask the learner to run `infracourse submit WEEK` again and send the new .zip unchanged"


class BundleError(Exception):
    """A bundle cannot be written or accepted. `kind` names the fault; the message names the file and the fix."""

    def __init__(self, source: str | Path, kind: str, reason: str):
        self.source, self.kind, self.reason = str(source), kind, reason
        super().__init__(f"{source}: {reason}")

    def __reduce__(self):  # crosses from an import's validating processes whole
        return type(self), (self.source, self.kind, self.reason)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileEntry(_Strict):
    sha256: str = Field(pattern=SHA256, description="sha256 of the member's bytes, lowercase hex.")
    size: int = Field(ge=0, description="The member's size in bytes, unpacked.")


class Manifest(_Strict):
    format_version: Literal[1, 2] = Field(description="Bumped when a field changes meaning (2: signed).")
    kind: Literal["infracourse-submission"] = "infracourse-submission"
    learner: str = Field(pattern=LEARNER_ID, description="The learner's id (workspace config `learner:` or --learner).")
    week: str = Field(pattern=WEEK_ID.pattern, description="weekNN of the submitted lab.")
    track: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,63}$", description="The learner's track "
                              "(workspace config `track:`) for a project week (22-24): the project graded and "
                              "submitted; null (and left out of the file and the signature) for weeks 1-21.")
    created_at: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", description="When submitted, UTC.")
    infracourse_version: str = Field(description="Version of the engine (and its graders) that graded it.")
    graders_sha256: str = Field(pattern=SHA256, description="Digest of lab.yaml and graders/weekNN (graders_digest).")
    environment: dict = Field(description="`Hardware.as_dict()` of the learner's machine: GPU, driver, CUDA, "
                                          "torch, triton, CPU and the device fingerprint.")
    ceilings: dict | None = Field(description="The learner's calibrated ceilings (copy_gbps, matmul_tflops); "
                                              "null on a machine without a GPU.")
    files: dict[str, FileEntry] = Field(description="Every other member of the zip, by name.")
    signature: str | None = Field(None, pattern=SHA256, description="HMAC-SHA256 (hex) of `signed_bytes()` "
                                  "under the learner's secret; null when submitted without one.")

    def canonical(self) -> dict:
        """Every field; `track` only when set, so a bundle of weeks 1-21 reads (and signs, and is identified)
        exactly as it did before the field existed."""
        return self.model_dump(exclude=None if self.track is not None else {"track"})

    def signed_bytes(self) -> bytes:
        """What the signature covers: every field but the signature (so every file's hash and the track),
        canonically."""
        body = {k: v for k, v in self.canonical().items() if k != "signature"}
        return b"infracourse-submission\0" + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def as_json(self) -> str:
        return self.model_dump_json(indent=1, exclude=None if self.track is not None else {"track"})

    def signed_by(self, key: bytes) -> bool:
        return self.signature is not None and hmac.compare_digest(self.signature, sign(self, key))


def sign(manifest: Manifest, key: bytes) -> str:
    return hmac.new(key, manifest.signed_bytes(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Bundle:
    source: str
    manifest: Manifest
    results: GradeResult
    files: dict[str, bytes]  # the learner's files, by name relative to the week folder
    results_json: str  # results.json as received (validated into `results`)
    data: bytes  # the zip exactly as received
    bundle_id: str  # sha256 of the canonical manifest: the same submission imported twice has the same id
    drills: dict | None = None  # the learner's drill record (drills.json); None in bundles without one
    executable: frozenset[str] = frozenset()  # files the learner's folder had executable (e.g. run.sh)


# ---------------------------------------------------------------- writing
def submit(workspace: Workspace, course: Course, week_ref: str | int, *, learner: str | None = None,
           hardware: Hardware | None = None, secret_file: Path | None = None) -> Path:
    """Bundle a week's files with its last grade, signed with the learner's secret (`secret_file`, else
    `secret:` in the workspace config; none: unsigned, which a gradebook with a roster refuses); returns
    `<workspace>/submissions/weekNN-<timestamp>.zip`."""
    week = course.week(week_ref)
    track = workspace.track if week.on_track else None
    if week.on_track and track is None:
        raise BundleError(workspace.meta / "config.yaml", "track", f"{week.id} is a week of the direction project, "
                          "and this workspace has no track chosen: choose yours (`infracourse track list`, then "
                          "`infracourse track choose NAME`), grade the week, then submit")
    lab = course.lab(week, track=track)
    config = workspace_config(workspace)
    secret = signing_secret(workspace, config, secret_file)
    who = learner or config.get("learner") or (secret and secret[0])
    if not who:
        raise BundleError(workspace.meta / "config.yaml", "submit", "no learner id: pass `--learner ID` (your "
                          "course login or e-mail), add a line `learner: ID` to this file, or pass the secret file "
                          "your instructor sent (`--secret-file FILE`)")
    who = str(who)
    if secret and secret[0] != who:
        raise BundleError(secret_file or workspace.meta / "config.yaml", "submit", f"this secret was issued to "
                          f"{secret[0]!r}, not {who!r}: use your own secret file, or fix your learner id")
    result = workspace.progress.last_grade(week.id)
    if result is None:
        raise BundleError(workspace.root, "submit", f"{week.id} has no grade yet: run `infracourse grade {week.id}` "
                          "first (the bundle carries your last grade), then submit")
    unknown = sorted({c.id for c in result.checks} - {c.id for c in lab.spec.checks})
    if unknown:
        raise BundleError(workspace.root, "submit", f"your last grade of {week.id} has check(s) {', '.join(unknown)} "
                          f"that {week.id} of " + (f"the {track} track" if track else "this course") + " does not "
                          f"have (graded before changing track or course?): run `infracourse grade {week.id}` "
                          "again, then submit")
    folder = workspace.week_dir(week)
    files = learner_files(folder)
    missing = [name for name in lab.spec.files if name not in files]
    if missing:
        raise BundleError(folder, "submit", f"{', '.join(missing)} missing: `infracourse reset {week.id}` restores "
                          "the starter (backing up what you have)")
    size = sum(map(len, files.values()))
    if size > MAX_UNPACKED_BYTES // 2:
        largest = sorted(files, key=lambda n: -len(files[n]))[:3]
        raise BundleError(folder, "submit", f"the week's files hold {size / 2**20:.0f} MiB (largest: "
                          f"{', '.join(largest)}); move data and traces out of {folder} and submit again")
    hw = hardware or detect()
    ceilings = cached_ceilings(hw) if hw.gpu_count else None
    created = time.gmtime()
    fields = dict(learner=who, week=week.id, track=track, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", created),
                  infracourse_version=__version__, graders_sha256=graders_digest(lab),
                  environment=hw.as_dict(), ceilings=asdict(ceilings) if ceilings else None)
    out = workspace.root / "submissions"
    out.mkdir(exist_ok=True)
    stem = f"{week.id}-{time.strftime('%Y%m%d-%H%M%S', created)}"
    path, n = out / f"{stem}.zip", 1
    while path.exists():
        n += 1
        path = out / f"{stem}-{n}.zip"
    drills = workspace.progress.drill_history()  # none answered yet: no drills.json, as before it existed
    return write_bundle(path, fields, files, result.as_dict(), key=secret and secret[1],
                        drills=drill_record.summary(drills) if drills else None,
                        executable=executable_files(folder, files))


def write_bundle(path: Path, fields: dict, files: dict[str, bytes], results: dict, *, key: bytes | None = None,
                 drills: dict | None = None, executable: Collection[str] = ()) -> Path:
    """Write a bundle atomically from manifest fields (all but `files`), learner files and results (and the
    drill record, when given), signed with `key` (the learner's secret) when given. The learner files named in
    `executable` are stored with mode 755, the rest 644: a week whose deployment runs `./run.sh` is regraded
    as the learner graded it (the mode is the zip's, outside the signed manifest: changing it can only make a
    regrade differ from the self-reported result, which the instructor then sees)."""
    members = {FILES + name: data for name, data in sorted(files.items())}
    members[RESULTS] = json.dumps(results, indent=1, sort_keys=True).encode()
    if drills is not None:
        members[drill_record.FILE] = drill_record.encode(drills)
    entries = {name: FileEntry(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
               for name, data in members.items()}
    manifest = Manifest(format_version=FORMAT_VERSION, files=entries, **fields)
    if key:
        manifest.signature = sign(manifest, key)
    part = path.with_name(path.name + ".part")
    with zipfile.ZipFile(part, "w") as zf:
        for name, data in {MANIFEST: manifest.as_json().encode(), **members}.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # same content, same bytes
            mode = 0o755 if name.startswith(FILES) and name[len(FILES):] in executable else 0o644
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, mode << 16
            zf.writestr(info, data)
    part.replace(path)
    return path


def executable_files(folder: Path, files: Collection[str]) -> set[str]:
    """Those of `files` (names relative to `folder`) that someone may execute there."""
    return {name for name in files if (folder / name).stat().st_mode & 0o111}


def learner_files(folder: Path) -> dict[str, bytes]:
    """The files of a week folder the grader would see (the runner's IGNORED patterns left out). Only regular
    files inside the folder: a symbolic link (which could bring any file of this machine into the bundle) or a
    special file (a FIFO would block) is refused, naming it, before anything is written."""
    if not folder.is_dir():
        raise BundleError(folder, "submit", "no such folder: unlock the week first (`infracourse unlock WEEK`)")
    files = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        skip = IGNORED(dirpath, dirnames + filenames)
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in dirnames + [f for f in filenames if f not in skip]:
            path = Path(dirpath) / name
            if path.is_symlink():
                raise BundleError(path, "submit", f"a symbolic link (to {os.readlink(path)}): submit sends only the "
                                  "files inside the week folder; replace the link with a copy of the file, or delete it")
            if name in filenames and not path.is_file():
                raise BundleError(path, "submit", "not a regular file (a FIFO, socket or device): submit sends only "
                                  "regular files; delete it from the week folder")
            if name in filenames:
                files[path.relative_to(folder).as_posix()] = path.read_bytes()
    return files


def graders_digest(lab: LabDir) -> str:
    """sha256 over lab.yaml and the week's grader files: tells which graders produced a result."""
    digest = hashlib.sha256()
    paths = [lab.path / "lab.yaml"] + sorted(p for p in lab.graders.rglob("*") if p.is_file()
                                             and "__pycache__" not in p.parts)
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def workspace_config(workspace: Workspace) -> dict:
    """The workspace's settings (.infracourse/config.yaml; {} without one); fails naming the line if not YAML."""
    config = workspace.meta / "config.yaml"
    try:
        data = yaml.safe_load(config.read_text()) if config.exists() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise BundleError(config, "submit", f"not valid YAML ({where}{getattr(exc, 'problem', exc)}); fix it or "
                          "pass --learner ID") from None
    return data if isinstance(data, dict) else {}


def signing_secret(workspace: Workspace, config: dict, secret_file: Path | None) -> tuple[str, bytes] | None:
    """(learner, key) from `--secret-file` or the config's `secret:` line; None when neither is given."""
    where: Path = secret_file or workspace.meta / "config.yaml"
    try:
        text = Path(secret_file).read_text() if secret_file else config.get("secret")
        return parse_secret(str(text)) if text else None
    except OSError as exc:
        raise BundleError(where, "submit", f"cannot be read ({exc.strerror}); pass the file your instructor "
                          "sent") from None
    except RosterError as exc:
        raise BundleError(where, "submit", str(exc)) from None


# ---------------------------------------------------------------- reading
def read_bundle(path: Path, course: Course) -> Bundle:
    """Read and validate a bundle file; raises BundleError naming the file, the fault and the fix."""
    try:
        size = path.stat().st_size
        if size > MAX_BUNDLE_BYTES:
            raise BundleError(path, "oversize", f"{size / 2**20:.1f} MiB is over the {MAX_BUNDLE_BYTES // 2**20} MiB "
                              "limit for a bundle; ask the learner to move data files out of the week folder and "
                              "run `infracourse submit WEEK` again")
        data = path.read_bytes()
    except OSError as exc:
        raise BundleError(path, "unreadable", f"cannot be read ({exc.strerror}); check the path") from None
    return parse_bundle(data, course, source=str(path))


def parse_bundle(data: bytes, course: Course, *, source: str) -> Bundle:
    """Validate bundle bytes (from a file, or as stored in the gradebook)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = _read_members(zf, source)
            executable = frozenset(i.filename[len(FILES):] for i in zf.infolist()
                                   if i.filename.startswith(FILES) and (i.external_attr >> 16) & 0o111)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        raise BundleError(source, "not-zip", f"not a readable zip file ({exc}); {RESEND}") from None
    manifest = _manifest(members, source)
    try:
        week = course.week(manifest.week)
    except KeyError as exc:
        week, why = None, exc.args[0]
    else:
        why = f"{week.id} is planned: its lab is not built"
    if week is None or week.planned:
        raise BundleError(source, "unknown-week", f"week {manifest.week!r} has no lab in this course ({why}); "
                          "check that the gradebook's course (INFRACOURSE_COURSE) is the one the learner took")
    _check_track(manifest, week, course, source)
    _check_hashes(members, manifest, source)
    return Bundle(source=source, manifest=manifest, results=_results(members[RESULTS], manifest, source),
                  files={n[len(FILES):]: b for n, b in members.items() if n.startswith(FILES)},
                  results_json=members[RESULTS].decode(), data=data,
                  bundle_id=hashlib.sha256(json.dumps(manifest.canonical(), sort_keys=True).encode()).hexdigest(),
                  drills=_drills(members, source), executable=executable)


def lab_of(course: Course, week: str, track: str | None) -> LabDir:
    """The lab a submission of `week` was graded against: for a project week (22-24), `track`'s project as
    staged for that week; else the week's lab (`track` is then None)."""
    return course.lab(week, track=track)


def _check_track(manifest: Manifest, week, course: Course, source: str) -> None:
    """A project week's bundle names a track of this course; any other week's names none."""
    if week.on_track and manifest.track is None:
        raise BundleError(source, "track", f"{manifest.week} is a week of the direction project but {MANIFEST} "
                          "names no track, so there is no telling which project to grade: ask the learner to "
                          "choose theirs (`infracourse track choose NAME`), update infracourse if it is older "
                          f"than the tracks, grade and run `infracourse submit {manifest.week}` again, and send "
                          "the new .zip unchanged")
    if week.on_track and manifest.track not in course.tracks:
        raise BundleError(source, "track", f"{MANIFEST} names track {manifest.track!r}, which this course does not "
                          f"have ({', '.join(course.tracks) or 'none'}); check that the gradebook's course "
                          "(INFRACOURSE_COURSE) is the one the learner took")
    if not week.on_track and manifest.track is not None:
        raise BundleError(source, "track", f"{MANIFEST} names track {manifest.track!r} but {manifest.week} is not "
                          f"a project week (tracks are for weeks 22-24); {RESEND}")


def _read_members(zf: zipfile.ZipFile, source: str) -> dict[str, bytes]:
    infos = [i for i in zf.infolist() if not (i.is_dir() and _safe(i.filename.rstrip("/")))]
    if len(infos) > MAX_MEMBERS:
        raise BundleError(source, "oversize", f"{len(infos)} members is over the limit of {MAX_MEMBERS}; {RESEND}")
    declared = sum(i.file_size for i in infos)
    if declared > MAX_UNPACKED_BYTES:
        raise BundleError(source, "oversize", f"unpacks to {declared / 2**20:.0f} MiB, over the "
                          f"{MAX_UNPACKED_BYTES // 2**20} MiB limit; {RESEND}")
    members: dict[str, bytes] = {}
    for info in infos:
        name = info.filename
        if not _safe(name) or stat.S_ISLNK(info.external_attr >> 16):
            raise BundleError(source, "traversal", f"member {name!r} could write outside the folder it is unpacked "
                              f"into (absolute path, '..', backslash or link); the bundle was not made by "
                              f"`infracourse submit`: {RESEND}")
        if name in members:
            raise BundleError(source, "manifest", f"member {name!r} appears twice; {RESEND}")
        with zf.open(info) as fh:
            members[name] = fh.read(info.file_size + 1)
        if len(members[name]) != info.file_size:
            raise BundleError(source, "not-zip", f"member {name!r} is not the size its header states; {RESEND}")
    return members


def _safe(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\\" not in name and ":" not in name \
        and all(p not in ("", ".", "..") for p in parts)


def _manifest(members: dict[str, bytes], source: str) -> Manifest:
    if MANIFEST not in members:
        raise BundleError(source, "manifest", f"no {MANIFEST} in the zip: this is not an infracourse submission; "
                          f"{RESEND}")
    try:
        return Manifest.model_validate_json(members[MANIFEST])
    except ValidationError as exc:
        raise BundleError(source, "manifest", f"{MANIFEST} is malformed ({_problems(exc)}); {RESEND}") from None


def _check_hashes(members: dict[str, bytes], manifest: Manifest, source: str) -> None:
    listed, present = set(manifest.files), set(members) - {MANIFEST}
    if present - listed:
        raise BundleError(source, "hash", f"member(s) {sorted(present - listed)} are not listed in {MANIFEST}: "
                          f"files were added after submitting; {RESEND}")
    if listed - present:
        raise BundleError(source, "hash", f"{MANIFEST} lists {sorted(listed - present)} but the zip lacks them; "
                          f"{RESEND}")
    if RESULTS not in listed:
        raise BundleError(source, "manifest", f"no {RESULTS} in the bundle: the learner must grade before "
                          f"submitting; {RESEND}")
    for name, entry in sorted(manifest.files.items()):
        actual = hashlib.sha256(members[name]).hexdigest()
        if actual != entry.sha256 or len(members[name]) != entry.size:
            raise BundleError(source, "hash", f"{name} does not match its sha256 in {MANIFEST} (manifest "
                              f"{entry.sha256[:12]}..., content {actual[:12]}...): the file changed after "
                              f"submitting; {RESEND}")


def _results(data: bytes, manifest: Manifest, source: str) -> GradeResult:
    try:
        result = _GRADE.validate_json(data)
    except ValidationError as exc:
        raise BundleError(source, "manifest", f"{RESULTS} is not a grade result ({_problems(exc)}); {RESEND}") from None
    if result.week != manifest.week:
        raise BundleError(source, "manifest", f"{RESULTS} grades {result.week} but {MANIFEST} says "
                          f"{manifest.week}; {RESEND}")
    return result


def _drills(members: dict[str, bytes], source: str) -> dict | None:
    if drill_record.FILE not in members:
        return None
    try:
        return drill_record.parse(members[drill_record.FILE])
    except drill_record.RecordError as exc:
        raise BundleError(source, "drills", f"{drill_record.FILE} is malformed ({exc}): it is not what "
                          f"`infracourse submit` writes; {RESEND} (a bundle without {drill_record.FILE}, "
                          "from an older infracourse, is accepted)") from None


def check_claims(bundle: Bundle, check_ids: set[str]) -> None:
    """Refuse a self-reported result no grader of this course could have written: a check id lab.yaml lacks
    (or twice), a GPU check passed on a machine the manifest says has none, a negative time or figure, a figure
    past MAX_FRACTION_OF_CEILING of its device's ceiling. The result is still only a claim after this."""
    seen: set[str] = set()
    gpu = bool(bundle.manifest.environment.get("gpu_count"))

    def refuse(reason: str):
        raise BundleError(bundle.source, "claims", f"{RESULTS}: {reason}; this result was not made by the course's "
                          f"graders. {RESEND}")

    if not _nonnegative(bundle.results.seconds):
        refuse(f"grade time {bundle.results.seconds!r} s is not a non-negative number")
    for check in bundle.results.checks:
        if check.id not in check_ids:
            refuse(f"check {check.id!r} is not in the week's lab.yaml ({', '.join(sorted(check_ids))})")
        if check.id in seen:
            refuse(f"check {check.id!r} appears twice")
        seen.add(check.id)
        if check.needs not in ("cpu", "") and check.status == "passed" and not gpu:
            refuse(f"check {check.id!r} needs {check.needs} but passed on a machine without a GPU")
        if not _nonnegative(check.seconds):
            refuse(f"check {check.id!r} took {check.seconds!r} s")
        for name, figure in check.figures.items():  # each a Figure: finite, typed (checked as results.json loaded)
            value, unit = figure.value, figure.unit
            if unit in NONNEGATIVE_UNITS and value < 0:  # other figures may be signed
                refuse(f"figure {check.id}/{name} = {value!r} {unit}: a time or rate is never negative")
            share = figure.fraction_of_ceiling
            if share is not None and share > MAX_FRACTION_OF_CEILING:
                refuse(f"figure {check.id}/{name} claims {share!r} of its device's ceiling (at most "
                       f"{MAX_FRACTION_OF_CEILING} is physically possible)")


def _nonnegative(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors()[:3])
