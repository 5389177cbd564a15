"""The published cohort site: static HTML that works from file:// and from any static host.

Layout of the site folder:
  index.html             the dashboard: the learners x built weeks grid first (a mark per cell: verified,
                         verified on CPU only, self-reported only, failing, disagrees; pass rate per week in
                         its header), then who is stuck, per-week rates and blocked counts, the drills'
                         per-topic accuracy across the cohort (when any bundle carries a drill record),
                         planned weeks last
  weeks/weekNN.html      per built week: checks-passed distribution, performance as a fraction of each
                         learner's own device ceilings, the kernel-week leaderboard, self-reported vs verified
  learners/<name>.html   one learner: per week the checks that do not pass with their messages, and the
                         submission timeline
  dashboard.js           sort and filter of the grid in the browser (the URL's #hash keeps the view);
                         without it every page still shows all its data
  style.css, cohort.json the stylesheet; the export's JSON document (the same names as the pages)
  .infracourse-site      marks a folder `publish` may replace
Relative links only, no fetch: nothing needs a server. Learner-supplied text (ids, device names, check
messages) is only ever autoescaped into HTML and read back by the script as text. `pseudonyms=True`
publishes a stable pseudonym per learner (keyed by a secret kept in the gradebook) instead of the learner id.
"""
from __future__ import annotations

import bisect
import hashlib
import hmac
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import jinja2

from infracourse.cohort import rubric
from infracourse.cohort.feedback import pages as feedback_files
from infracourse.cohort.export import document, row
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.standing import Cohort, Stuck, WeekInfo, cohort_standing, stuck
from infracourse.course import Course
from infracourse.safe_text import finalize

TEMPLATES = Path(__file__).parent / "templates"
SITE_MARKER = ".infracourse-site"
FRACTION_BINS = [(i / 10, f"{i * 10}–{i * 10 + 10} %") for i in range(10)] + [(1.0, "≥ 100 %")]
# mark -> (symbol, label, sort rank): colour and a symbol, so the grid never relies on colour alone
MARKS = {"verified": ("◆", "verified: regraded, every check passed", 5),
         "cpu": ("✔", "verified on CPU only: GPU checks not run by the regrade", 4),
         "self": ("○", "self-reported complete, not regraded", 3),
         "disagrees": ("≠", "the regrade disagrees with the learner's report", 1),
         "failing": ("✗", "checks failing", 1),
         "none": ("·", "not submitted", 0)}
UNSANDBOXED = "!"


class PublishError(Exception):
    """The site cannot be written where asked; the message says why and what to do."""


def publish(gradebook: Gradebook, course: Course, out: Path, *, pseudonyms: bool = False,
            now: datetime | None = None, stuck_attempts: int = 3, idle_days: int = 7, feedback: bool = False) -> Path:
    """Render the cohort site into `out` (replacing an earlier site there, never other files).

    A learner is listed as stuck when the same check failed in each of their last `stuck_attempts`
    submissions of a week they have not passed, or when they have not submitted for `idle_days` days (at
    `now`, default the current time) with a built week unpassed."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / SITE_MARKER).exists():
        raise PublishError(f"{out} holds files that are not a published site; choose an empty or new folder")
    now = now or datetime.now(timezone.utc)
    cohort = cohort_standing(gradebook, course, details=True)
    stuck_list = stuck(cohort, attempts=stuck_attempts, idle_days=idle_days, now=now)
    stuck_of: dict[str, list[Stuck]] = {}
    for s in stuck_list:
        stuck_of.setdefault(s.learner, []).append(s)
    reviews = rubric.feedback(gradebook, course) if feedback else {}  # each learner's page: their own only
    names = learner_names(cohort.learners, gradebook.meta("pseudonym_key") if pseudonyms else None)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             finalize=finalize)  # learner text: control characters out
    env.globals.update(name=names.get, page=lambda learner: f"learners/{quote(names[learner])}.html",
                       percent=lambda x: "" if x is None else f"{x:.0%}", title=cohort.title,
                       marks=MARKS, unsandboxed_mark=UNSANDBOXED, stuck_reason=stuck_reason, day=lambda t: t[:10],
                       generated_at=now.strftime("%Y-%m-%d %H:%M UTC"))
    rules = {"attempts": stuck_attempts, "idle_days": idle_days}
    drills = gradebook.drill_accuracy()
    pages = {"index.html": env.get_template("index.html.j2").render(
        root="", cohort=cohort, weeks=_summaries(cohort), rows=_rows(cohort, stuck_of), stuck=stuck_list, stuck_of=stuck_of, rules=rules,
        planned=[w for w in cohort.weeks if not w.built], drills=drills)}
    for week in cohort.built_weeks():
        pages[f"weeks/{week.id}.html"] = env.get_template("week.html.j2").render(root="../", **_week(cohort, week))
    for learner in cohort.learners:
        cells = [cohort.cell(learner, w.id) for w in cohort.built_weeks()]
        pages[f"learners/{names[learner]}.html"] = env.get_template("learner.html.j2").render(
            root="../", learner=learner, cells=cells, weeks={w.id: w for w in cohort.weeks},
            stuck=stuck_of.get(learner, []), last=cohort.last_activity(learner), attempts=stuck_attempts,
            feedback={w.id: reviews[learner, w.id] for w in cohort.built_weeks() if (learner, w.id) in reviews})
    data = document(cohort, [{**row(cohort.cell(l, w.id)), "learner": names[l]}
                             for l in cohort.learners for w in cohort.built_weeks()])
    data["learners"] = [names[l] for l in cohort.learners]
    if drills["learners"]:  # a cohort whose bundles carry no drill record publishes what it did before
        data["drills"] = drills
    pages["cohort.json"] = json.dumps(data) + "\n"  # compact: for tools (the C encoder is 5x faster)
    for asset in ("style.css", "dashboard.js"):
        pages[asset] = (TEMPLATES / asset).read_text(encoding="utf-8")
    if feedback:  # each learner's file, found and checked with their own secret (infracourse feedback WEEK)
        pages |= feedback_files({who.id: bytes.fromhex(key) for who, key in gradebook.roster()}, reviews)
    pages[SITE_MARKER] = "written by `infracourse cohort publish`; the next publish replaces this folder\n"
    _write_site(out, pages)
    return out


def learner_names(learners: list[str], key: str | None) -> dict[str, str]:
    """What the site calls each learner: the id, or `learner-<hmac>` when publishing pseudonyms."""
    if key is None:
        return {l: l for l in learners}
    return {l: "learner-" + hmac.new(key.encode(), l.encode(), hashlib.sha256).hexdigest()[:10] for l in learners}


def _summaries(cohort: Cohort) -> list[dict]:
    """Per built week: how many learners of the cohort submitted and pass it (as rates), by mark, and how
    many have checks blocked (owed to hardware) or a regrade that ran unsandboxed."""
    summaries, everyone = [], len(cohort.learners) or 1
    for week in cohort.built_weeks():
        cells = [cohort.cell(l, week.id) for l in cohort.learners]
        marks = [c.mark for c in cells]
        passing = sum(c.passing for c in cells)
        summaries.append({"week": week, "submitted": len(cells) - marks.count("none"), "passing": passing,
                          "rate": passing / everyone, "submitted_rate": (len(cells) - marks.count("none")) / everyone,
                          "verified_rate": (marks.count("verified") + marks.count("cpu")) / everyone,
                          "marks": {m: marks.count(m) for m in MARKS},
                          "blocked": sum(c.blocked > 0 for c in cells), "unsandboxed": sum(c.unsandboxed for c in cells)})
    return summaries


def _rows(cohort: Cohort, stuck_of: dict[str, list[Stuck]]) -> list[dict]:
    """The grid's rows; `flags` are what the dashboard's "show" filter selects on."""
    rows = []
    for learner in cohort.learners:
        cells = [cohort.cell(learner, w.id) for w in cohort.built_weeks()]
        flags = {c.mark for c in cells} | {"blocked" for c in cells if c.blocked} \
            | {"unsandboxed" for c in cells if c.unsandboxed} | ({"stuck"} if learner in stuck_of else set())
        rows.append({"learner": learner, "last": cohort.last_activity(learner), "cells": cells,
                     "passed": sum(c.passing for c in cells), "flags": sorted(flags)})
    return rows


def _week(cohort: Cohort, week: WeekInfo) -> dict:
    cells = [c for c in (cohort.cell(l, week.id) for l in cohort.learners) if c.submissions]
    passed = _histogram([c.self_passed for c in cells], [(n, str(n)) for n in range(week.checks + 1)])
    performance = []
    for check in week.performance:
        shares = [c.best[check].normalised for c in cells if check in c.best and c.best[check].normalised is not None]
        performance.append({"check": check, "measured": len(shares), "bins": _histogram(shares, FRACTION_BINS)})
    leaders = sorted((c for c in cells if c.score is not None), key=lambda c: (-c.score, c.learner))
    failing: dict[str, int] = {}  # check -> learners whose newest submission fails it
    for c in cells:
        for f in c.failures:
            if f.status in ("failed", "error"):
                failing[f.check] = failing.get(f.check, 0) + 1
    return {"week": week, "cells": cells, "passed": passed, "performance": performance, "leaders": leaders,
            "learners": len(cohort.learners), "passing": sum(c.passing for c in cells),
            "failing": sorted(failing.items(), key=lambda kv: (-kv[1], kv[0]))}


def _histogram(values: list[float], bins: list[tuple[float, str]]) -> list[dict]:
    """Counts per bin (a value falls in the last bin whose lower edge it reaches), with bar widths in %."""
    edges, counts = [low for low, _ in bins], [0] * len(bins)
    for value in values:
        counts[max(bisect.bisect_right(edges, value) - 1, 0)] += 1
    top = max(counts, default=0) or 1
    return [{"label": label, "count": n, "width": round(100 * n / top, 1)} for (_, label), n in zip(bins, counts)]


def _write_site(out: Path, pages: dict[str, str]) -> None:
    """Write into a sibling folder, then swap it in: readers never see half a site."""
    fresh = out.with_name(f".{out.name}.publishing")
    shutil.rmtree(fresh, ignore_errors=True)
    for name, text in pages.items():
        (fresh / name).parent.mkdir(parents=True, exist_ok=True)
        (fresh / name).write_text(text, encoding="utf-8")
    if out.exists():
        old = out.with_name(f".{out.name}.replaced")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        fresh.rename(out)
        shutil.rmtree(old)
    else:
        fresh.rename(out)


def stuck_reason(s: Stuck, attempts: int) -> str:
    if s.week:
        return f"failed {', '.join(s.checks)} in each of the last {attempts} submissions ({s.attempts} in all)"
    if s.idle_days < 0:
        return "no submission yet"
    return f"no submission for {s.idle_days} days"
