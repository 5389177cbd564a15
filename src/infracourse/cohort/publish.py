"""The published cohort site: static HTML that works from file:// and from any static host.

Layout of the site folder:
  index.html             cohort progress: per-week counts and the learners x weeks grid
  weeks/weekNN.html      per built week: checks-passed distribution, performance as a fraction of each
                         learner's own device ceilings, the kernel-week leaderboard, self-reported vs verified
  learners/<name>.html   one learner across the weeks
  style.css, cohort.json the stylesheet; the export's JSON document (the same names as the pages)
  .infracourse-site      marks a folder `publish` may replace
Relative links only, no script, no fetch: nothing needs a server. `pseudonyms=True` publishes a stable
pseudonym per learner (keyed by a secret kept in the gradebook) instead of the learner id.
"""
from __future__ import annotations

import bisect
import hashlib
import hmac
import json
import shutil
import time
from pathlib import Path
from urllib.parse import quote

import jinja2

from infracourse.cohort.export import document, row
from infracourse.cohort.gradebook import Gradebook
from infracourse.cohort.standing import Cohort, Standing, WeekInfo, cohort_standing
from infracourse.course import Course

TEMPLATES = Path(__file__).parent / "templates"
SITE_MARKER = ".infracourse-site"
FRACTION_BINS = [(i / 10, f"{i * 10}–{i * 10 + 10} %") for i in range(10)] + [(1.0, "≥ 100 %")]


class PublishError(Exception):
    """The site cannot be written where asked; the message says why and what to do."""


def publish(gradebook: Gradebook, course: Course, out: Path, *, pseudonyms: bool = False,
            generated_at: str | None = None) -> Path:
    """Render the cohort site into `out` (replacing an earlier site there, never other files)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / SITE_MARKER).exists():
        raise PublishError(f"{out} holds files that are not a published site; choose an empty or new folder")
    cohort = cohort_standing(gradebook, course)
    names = _names(cohort.learners, gradebook.meta("pseudonym_key") if pseudonyms else None)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.globals.update(name=names.get, page=lambda learner: f"learners/{quote(names[learner])}.html",
                       percent=lambda x: "" if x is None else f"{x:.0%}", state_label=state_label, title=cohort.title,
                       generated_at=generated_at or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    pages = {"index.html": env.get_template("index.html.j2").render(root="", cohort=cohort, weeks=_summaries(cohort))}
    for week in cohort.built_weeks():
        pages[f"weeks/{week.id}.html"] = env.get_template("week.html.j2").render(root="../", **_week(cohort, week))
    for learner in cohort.learners:
        cells = [cohort.cell(learner, w.id) for w in cohort.built_weeks()]
        pages[f"learners/{names[learner]}.html"] = env.get_template("learner.html.j2").render(
            root="../", learner=learner, cells=cells, weeks={w.id: w for w in cohort.weeks})
    data = document(cohort, [{**row(cohort.cell(l, w.id)), "learner": names[l]}
                             for l in cohort.learners for w in cohort.built_weeks()])
    data["learners"] = [names[l] for l in cohort.learners]
    pages["cohort.json"] = json.dumps(data) + "\n"  # compact: for tools (the C encoder is 5x faster)
    pages["style.css"] = (TEMPLATES / "style.css").read_text(encoding="utf-8")
    pages[SITE_MARKER] = "written by `infracourse cohort publish`; the next publish replaces this folder\n"
    _write_site(out, pages)
    return out


def _names(learners: list[str], key: str | None) -> dict[str, str]:
    """What the site calls each learner: the id, or `learner-<hmac>` when publishing pseudonyms."""
    if key is None:
        return {l: l for l in learners}
    return {l: "learner-" + hmac.new(key.encode(), l.encode(), hashlib.sha256).hexdigest()[:10] for l in learners}


def _summaries(cohort: Cohort) -> list[dict]:
    summaries = []
    for week in cohort.weeks:
        cells = [cohort.cell(l, week.id) for l in cohort.learners]
        states = [c.state for c in cells]
        summaries.append({"week": week, "submitted": sum(s != "none" for s in states),
                          "complete": sum(c.self_complete for c in cells if c.submissions),
                          "verified": states.count("verified"), "disagree": states.count("disagrees")})
    return summaries


def _week(cohort: Cohort, week: WeekInfo) -> dict:
    cells = [c for c in (cohort.cell(l, week.id) for l in cohort.learners) if c.submissions]
    passed = _histogram([c.self_passed for c in cells], [(n, str(n)) for n in range(week.checks + 1)])
    performance = []
    for check in week.performance:
        shares = [c.best[check].normalised for c in cells if check in c.best and c.best[check].normalised is not None]
        performance.append({"check": check, "measured": len(shares), "bins": _histogram(shares, FRACTION_BINS)})
    leaders = sorted((c for c in cells if c.score is not None), key=lambda c: (-c.score, c.learner))
    return {"week": week, "cells": cells, "passed": passed, "performance": performance, "leaders": leaders}


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


def state_label(cell: Standing) -> str:
    return {"none": "", "disagrees": "≠ disagrees", "verified": "✔ verified", "complete": "✔ self-reported",
            "incomplete": "in progress"}[cell.state]
