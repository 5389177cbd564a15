"""Helpers for the cohort tests: bundles rebuilt with faults, gradebook dumps, and a headless Chromium crawler."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import sqlite3
import time
import zipfile
from contextlib import closing
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-pipe"]


# ---------------------------------------------------------------- bundles
def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def rezip(path: Path, files: dict[str, bytes], *, rehash: bool = False) -> Path:
    """Write `files` as a zip at `path`; with rehash, manifest.json's hashes are made to match (a forger's
    bundle, consistent except for what the test broke on purpose)."""
    if rehash:
        manifest = json.loads(files["manifest.json"])
        manifest["files"] = {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}
                             for n, b in files.items() if n != "manifest.json"}
        files = {**files, "manifest.json": json.dumps(manifest).encode()}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def publish_with_learner_text(course, tmp_path: Path, text: str) -> Path:
    """A site published from one signed-looking bundle whose results say `text` as the device and as its first
    check's message: what a learner writes and the instructor's published pages show."""
    from infracourse.cohort import synthetic
    from infracourse.cohort.gradebook import Gradebook
    from infracourse.cohort.publish import publish

    good = synthetic.write_cohort(course, tmp_path / "bundles", learners=1, seed=8, missing=0)[0]
    files = members(good)
    results = json.loads(files["results.json"])
    results["device"] = text
    results["checks"][0].update(status="failed", message=text)
    forged = rezip(tmp_path / "forged.zip", {**files, "results.json": json.dumps(results).encode()}, rehash=True)
    book = Gradebook.create(tmp_path / "gradebook.db", course)
    assert book.import_bundles([forged], course).committed
    return publish(book, course, tmp_path / "site")


def dump(gradebook_path: Path) -> list[str]:
    """The gradebook's whole logical content, to compare before and after."""
    with closing(sqlite3.connect(gradebook_path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return list(db.iterdump())


# ---------------------------------------------------------------- browser
class Chromium:
    """Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages ending
    in NUL on fds 3 and 4), so no websocket library is needed."""

    def __init__(self, profile: Path):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        assert exe, "chromium is not installed: `apt-get install chromium` (CI's .ci/run installs it)"
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # above fd 9, so that the dup2 onto 3 and 4 below cannot clobber one of our own pipe ends
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser)]
        for fd in (to_browser, from_browser):
            os.close(fd)
        self.pid = os.posix_spawn(exe, [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                  os.environ, file_actions=[
                                      (os.POSIX_SPAWN_DUP2, ends[0], 3), (os.POSIX_SPAWN_DUP2, ends[1], 4),
                                      (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                      (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
        for fd in ends:
            os.close(fd)
        self._buffer, self._next, self.events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    def call(self, method: str, session: bool = False, timeout: float = 30, **params) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive(timeout)
            if reply.get("id") == self._next:
                assert "error" not in reply, (method, reply["error"])
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._receive(timeout)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def _receive(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "chromium did not answer in time"
            chunk = os.read(self._read, 1 << 16)
            assert chunk, "chromium closed the DevTools pipe"
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (AssertionError, OSError):
            pass
        deadline = time.monotonic() + 10
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                break
            time.sleep(0.05)
        os.close(self._write)
        os.close(self._read)


PAGE_FACTS = """JSON.stringify({
  title: document.title,
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  styled: getComputedStyle(document.body).marginTop === '0px'
})"""


def crawl(site: Path, profile: Path) -> dict[str, dict]:
    """Visit every page reachable from index.html; assert each loads styled, without console errors,
    and that every link points at an existing file (and an existing id, for #fragments)."""
    site = site.resolve()
    browser = Chromium(profile)
    seen: dict[str, dict] = {}
    fragments: list[tuple[str, str, str]] = []
    queue = [(site / "index.html").as_uri()]
    try:
        while queue:
            url = queue.pop()
            if url in seen:
                continue
            browser.events.clear()
            navigated = browser.call("Page.navigate", session=True, url=url)
            assert "errorText" not in navigated, (url, navigated)
            browser.wait_for("Page.loadEventFired")
            facts = json.loads(browser.call("Runtime.evaluate", session=True, expression=PAGE_FACTS,
                                            returnByValue=True)["result"]["value"])
            problems = [e for e in browser.events if _is_error(e)]
            assert not problems, (url, problems)
            assert facts["styled"], f"{url}: style.css did not apply"
            assert facts["title"], f"{url}: no title"
            seen[url] = facts
            for link in facts["links"]:
                target, fragment = urldefrag(link)
                assert target.startswith("file://"), (url, link)
                path = Path(unquote(urlparse(target).path))
                assert path.is_file(), f"{url} links to {link}, which does not exist"
                assert site in path.parents, f"{url} links outside the site: {link}"
                if fragment:
                    fragments.append((url, target, fragment))
                if path.suffix == ".html":
                    queue.append(target)
    finally:
        browser.close()
    for url, target, fragment in fragments:
        assert fragment in seen[target]["ids"], f"{url} links to #{fragment} which {target} lacks"
    pages = {p.as_uri() for p in site.rglob("*.html")}
    assert pages == set(seen), f"pages no link reaches: {sorted(pages - set(seen))}"
    return seen


def _is_error(event: dict) -> bool:
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.exceptionThrown":
        return True
    if method == "Runtime.consoleAPICalled":
        return params.get("type") in ("error", "assert", "warning")
    if method == "Log.entryAdded":
        return params.get("entry", {}).get("level") in ("error", "warning")
    return False
