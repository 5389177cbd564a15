"""Similar submissions of the same week: a signal for the instructor to look at, never a verdict.

For the newest submission of each learner x week, its Python files are tokenised and normalised: comments
and layout dropped, every identifier `N`, every string `S`, every number `0`, keywords and operators kept.
Renaming variables, rewording comments or reformatting then changes nothing. Then:
  identical   the same files byte for byte (kind `identical`), or the same normalised tokens (`renamed`):
              grouped by a hash, so a group of any size costs one pass
  near        winnowing (Schleimer, Wilkerson and Aiken, SIGMOD 2003, the algorithm behind MOSS): hashes of
              every K consecutive tokens, the minimum of each window of W kept as the file's fingerprints;
              any run of K + W - 1 tokens two submissions share is guaranteed a common fingerprint. Two
              submissions are near when the shared fingerprints cover `threshold` of the smaller one.
Fingerprints of the week's starter code are removed first (everyone was given it), and a submission with
fewer than `min_fingerprints` of its own is not compared (a three-line answer looks like every other).
Pairs are counted through an inverted index (fingerprint -> submissions), skipping fingerprints that more
than `common` of the week share (boilerplate), so the cost follows the code, not learners squared.

Why not `copydetect`: it compares every pair of files (quadratic: 12.5 M pairs a week at 5,000 learners)
and renders HTML reports; the same winnowing on an inverted index is ~100 lines with no dependency, and its
output joins the gradebook's own reports. Results go to the instructor (`cohort similar`, a CSV export) and
never into the published site.
"""
from __future__ import annotations

import csv
import hashlib
import io
import keyword
import tokenize
import zipfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from infracourse.cohort.bundle import FILES, lab_of
from infracourse.cohort.gradebook import Gradebook
from infracourse.course import Course
from infracourse.syllabus import CourseFileError

K = 8  # tokens per k-gram
W = 8  # k-grams per winnowing window: a shared run of K + W - 1 = 15 tokens is always caught
COLUMNS = ("week", "kind", "score", "learners", "shared", "detail")


@dataclass(frozen=True)
class Match:
    week: str
    kind: str  # identical | renamed | near
    score: float  # 1.0 for identical and renamed; shared fingerprints / the smaller submission's for near
    learners: tuple[str, ...]  # a group for identical/renamed, a pair for near
    shared: int = 0  # fingerprints in common (near)
    detail: str = ""


def normalised_tokens(source: str) -> list[str]:
    """The token stream compared: comments and layout dropped, names/strings/numbers made anonymous.
    Code that does not tokenise is compared on what tokenised before the fault."""
    out: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME:
                out.append(tok.string if keyword.iskeyword(tok.string) else "N")
            elif tok.type == tokenize.STRING or tok.type in _FSTRING:
                if not out or out[-1] != "S":
                    out.append("S")
            elif tok.type == tokenize.NUMBER:
                out.append("0")
            elif tok.type == tokenize.OP:
                out.append(tok.string)
            elif tok.type in (tokenize.INDENT, tokenize.DEDENT):
                out.append(tokenize.tok_name[tok.type])
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return out


_FSTRING = {getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)}


def fingerprints(tokens: list[str]) -> set[int]:
    """Winnowed k-gram hashes (the rightmost minimum of each window)."""
    grams = [int.from_bytes(hashlib.blake2b(" ".join(tokens[i:i + K]).encode(), digest_size=8).digest(), "big")
             for i in range(len(tokens) - K + 1)]
    if len(grams) <= W:
        return {min(grams)} if grams else set()
    chosen = set()
    for start in range(len(grams) - W + 1):
        window = grams[start:start + W]
        chosen.add(min(window))
    return chosen


def code_of(files: dict[str, bytes]) -> tuple[str, str]:
    """(all Python source of a submission in name order, the same normalised)."""
    text = "\n".join(files[n].decode("utf-8", "replace") for n in sorted(files) if n.endswith(".py"))
    return text, " ".join(normalised_tokens(text))


def similar(gradebook: Gradebook, course: Course, *, week: str | None = None, threshold: float = 0.8,
            min_fingerprints: int = 12, common: float = 0.2) -> list[Match]:
    """Matches among the newest submissions of each week (or one week), strongest first."""
    weeks = sorted({s.week for s in gradebook.latest_submissions(week=week)})
    found: list[Match] = []
    for wk in weeks:
        found += _week(gradebook, course, wk, threshold, min_fingerprints, common)
    return sorted(found, key=lambda m: (m.week, -m.score, m.kind, m.learners))


def _week(gradebook: Gradebook, course: Course, week: str, threshold: float, min_fingerprints: int,
          common: float) -> list[Match]:
    starters: dict[str | None, set[int]] = {}  # by track: a project week's starter is its track's
    exact, renamed = defaultdict(list), defaultdict(list)
    prints: dict[str, set[int]] = {}
    for sub in gradebook.latest_submissions(week=week):  # one bundle in memory at a time
        if sub.track not in starters:
            starters[sub.track] = _starter_prints(course, week, sub.track)
        text, norm = code_of(_files(gradebook.bundle_data(sub.id)))
        own = fingerprints(norm.split()) - starters[sub.track]
        if len(own) < min_fingerprints:
            continue  # too little of its own code to tell anything
        prints[sub.learner] = own
        exact[hashlib.sha256(text.encode()).hexdigest()].append(sub.learner)
        renamed[hashlib.sha256(norm.encode()).hexdigest()].append(sub.learner)
    found, grouped = [], set()
    for kind, groups in (("identical", exact), ("renamed", renamed)):
        for members in groups.values():
            if len(members) > 1 and not set(members) <= grouped:
                found.append(Match(week, kind, 1.0, tuple(sorted(members)),
                                   detail=f"{len(members)} submissions with the same code"
                                   + (" after renaming and reformatting" if kind == "renamed" else "")))
                grouped |= set(members)
    index: dict[int, list[str]] = defaultdict(list)
    for learner, own in prints.items():
        for fp in own:
            index[fp].append(learner)
    cap = max(2, int(common * len(prints)))
    shared: Counter = Counter()
    for learners in index.values():
        if 1 < len(learners) <= cap:
            for i, a in enumerate(learners):
                for b in learners[i + 1:]:
                    shared[(a, b) if a < b else (b, a)] += 1
    same = {frozenset(m.learners) for m in found}
    for (a, b), n in shared.items():
        score = n / min(len(prints[a]), len(prints[b]))
        if score >= threshold and not any({a, b} <= group for group in same):
            found.append(Match(week, "near", round(score, 3), (a, b), n,
                               f"{n} of {min(len(prints[a]), len(prints[b]))} fingerprints of the smaller shared"))
    return found


def _starter_prints(course: Course, week: str, track: str | None = None) -> set[int]:
    try:
        folder = lab_of(course, week, track).starter
    except CourseFileError:  # a project week without a track, or a track the course no longer has
        return set()
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*.py")} if folder.is_dir() else {}
    return fingerprints(code_of(files)[1].split())


def _files(data: bytes) -> dict[str, bytes]:
    """The learner's Python files of a stored bundle (validated when it was imported)."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n[len(FILES):]: zf.read(n) for n in zf.namelist() if n.startswith(FILES) and n.endswith(".py")}


def write_csv(matches: list[Match], out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    with part.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for m in matches:
            writer.writerow([m.week, m.kind, m.score, " ".join(m.learners), m.shared, m.detail])
    part.replace(out)
    return out
