"""A headless Chromium driven over the Chrome DevTools Protocol on a pipe (standard library only).

Chromium started with --remote-debugging-pipe reads protocol commands from file descriptor 3 and
writes responses and events to file descriptor 4, each message one JSON object ended by a NUL
byte. This module starts it that way, loads the pages it is given in a few tabs at a time, and
for each page collects what it reported (uncaught exceptions, console errors, failed loads), asks
its DOM which images did not render and whether the navigation tree was filled in, and takes a
screenshot where asked. Every wait has a deadline, so a hung browser fails
the check instead of hanging it. docs/check_site.py uses it.
"""
import base64
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time


class BrowserError(Exception):
    """The browser did not start, died, or did not answer in time."""


# Runs in the page after it has loaded: waits (at most 3 s) for Doxygen's navigation tree to be
# filled in by its scripts, then reports what did not render and which pictures stick out of the
# text column (and so are cut off).
PAGE_REPORT = r"""
(async () => {
  const navItems = () => document.querySelectorAll('#nav-tree-contents li').length;
  const end = Date.now() + 3000;
  while (document.getElementById('nav-tree') && navItems() === 0 && Date.now() < end)
    await new Promise(r => setTimeout(r, 50));
  const brokenImages = [...document.images]
    .filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src'));
  const brokenObjects = [...document.querySelectorAll('object[data]')].filter(o => {
    const doc = o.contentDocument, box = o.getBoundingClientRect();
    return !doc || !doc.documentElement || doc.documentElement.localName !== 'svg' ||
           box.width === 0 || box.height === 0;
  }).map(o => o.getAttribute('data'));
  // A picture is cut off when it runs under the table of contents or past the page's content,
  // or when an SVG without a viewBox is shown narrower than it was drawn (it does not scale).
  const toc = document.querySelector('div.toc');
  const clippedPictures = [...document.querySelectorAll('div.image img, div.image object')]
    .filter(p => {
      const box = p.getBoundingClientRect(), contents = p.closest('div.contents');
      let limit = contents ? contents.getBoundingClientRect().right : window.innerWidth;
      if (toc) {
        const t = toc.getBoundingClientRect();
        if (t.width > 0 && t.left > box.left) limit = Math.min(limit, t.left);
      }
      const svg = p.localName === 'object' && p.contentDocument && p.contentDocument.documentElement;
      const unscaled = svg && svg.localName === 'svg' && !svg.hasAttribute('viewBox') &&
                       parseFloat(svg.getAttribute('width')) > box.width + 1;
      return box.width > 0 && (box.right > limit + 1 || unscaled);
    }).map(p => p.getAttribute('src') || p.getAttribute('data'));
  return {title: document.title, hasNavTree: !!document.getElementById('nav-tree'),
          navItems: navItems(), brokenImages, brokenObjects, clippedPictures};
})()
"""


class Browser:
    """One headless Chromium and its tabs; use as a context manager so the browser always ends."""

    def __init__(self, chromium, width=1280, height=1000, timeout=20.0):
        self.timeout = timeout
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="kvlab-chromium-")
        self.log_path = os.path.join(self.profile, "chromium.log")
        self.buffer = b""
        self.events = []
        self.replies = {}  # answers read while waiting for another, by id
        self.next_id = 0
        self.sessions = []  # one per tab
        self.pid = None
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        # The child's ends, moved above 9 so that placing them on 3 and 4 cannot overwrite either.
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        args = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--allow-file-access-from-files", "about:blank"]
        try:
            # Its own session, so that ending it ends its helper processes too.
            self.pid = os.posix_spawn(chromium, args, os.environ, setsid=True, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2),
                (os.POSIX_SPAWN_DUP2, child_r, 3), (os.POSIX_SPAWN_DUP2, child_w, 4)])
        except OSError as e:
            self.close()
            raise BrowserError(f"could not start {chromium}: {e}") from e
        finally:
            for fd in (child_r, child_w, log):
                os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def log_tail(self, lines=15):
        """The last lines Chromium wrote to its standard output and error."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def _read(self, deadline):
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout:g} s")
            if select.select([self.from_browser], [], [], left)[0]:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError("Chromium closed its DevTools pipe (it exited); its log:\n"
                                       + self.log_tail())
                self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(message)

    def _wait_for(self, matches, seconds):
        """Waits for an event that `matches`; returns it, or None after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            for event in self.events:
                if matches(event):
                    return event
            try:
                event = self._read(deadline)
            except BrowserError:
                if time.monotonic() >= deadline:
                    return None
                raise
            if "method" in event:
                self.events.append(event)
            elif "id" in event:
                self.replies[event["id"]] = event

    def _tab(self, index):
        """The index-th tab (a page target and the session attached to it), opened when needed."""
        while len(self.sessions) <= index:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = self.call("Target.attachToTarget",
                                {"targetId": target, "flatten": True})["sessionId"]
            for method in ("Page.enable", "Runtime.enable", "Log.enable"):
                self.call(method, session=session)
            self.call("Page.setLifecycleEventsEnabled", {"enabled": True}, session=session)
            self.call("Emulation.setDeviceMetricsOverride", {"width": self.width,
                      "height": self.height, "deviceScaleFactor": 1, "mobile": False},
                      session=session)
            self.sessions.append(session)
        return self.sessions[index]

    def send(self, method, params=None, session=None):
        """Sends one command without waiting; returns its id for result()."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        return self.next_id

    def result(self, id, method):
        """The result of command `id` (`method`, for the message); events meanwhile are kept."""
        if id in self.replies:
            reply = self.replies.pop(id)
        else:
            deadline = time.monotonic() + self.timeout
            while True:
                reply = self._read(deadline)
                if reply.get("id") == id:
                    break
                if "method" in reply:
                    self.events.append(reply)
                elif "id" in reply:
                    self.replies[reply["id"]] = reply
        if "error" in reply:
            raise BrowserError(f"{method} failed: {reply['error'].get('message')}")
        return reply.get("result", {})

    def call(self, method, params=None, session=None):
        """Sends one command and returns its result."""
        return self.result(self.send(method, params, session), method)

    def check(self, pages, tabs=6):
        """Loads each (name, url, screenshot or None) of `pages`, up to `tabs` at a time; returns
        {name: [problem, ...]} with an empty list for a page that showed none, and writes a PNG
        of the viewport to each page's `screenshot`. Every wait has its own deadline: a tab's load
        (`timeout`), then its network settling (3 s) and its navigation tree (3 s), so a batch of
        n tabs that all fail takes at most about n x (timeout + 6 s)."""
        results = {}
        for first in range(0, len(pages), tabs):
            batch = [(self._tab(i), *page) for i, page in enumerate(pages[first:first + tabs])]
            self.events = []
            loading = []
            for session, name, url, screenshot in batch:
                nav = self.call("Page.navigate", {"url": url}, session=session)
                if nav.get("errorText"):
                    results[name] = [f"it did not open: {nav['errorText']}"]
                else:
                    loading.append((session, nav["frameId"], name, screenshot))
            loaded = []
            for session, frame, name, screenshot in loading:
                if not self._wait_for(self._event(session, "Page.loadEventFired"), self.timeout):
                    results[name] = [f"it did not finish loading within {self.timeout:g} s"]
                else:
                    loaded.append((session, frame, name, screenshot))
            # Scripts that load more files (the navigation tree, the search index) settle by then.
            for session, frame, _, _ in loaded:
                self._wait_for(self._event(session, "Page.lifecycleEvent", "networkIdle", frame), 3.0)
            asked = [(self.send("Runtime.evaluate", {"expression": PAGE_REPORT, "awaitPromise": True,
                                "returnByValue": True}, session=session), session, name, screenshot)
                     for session, _, name, screenshot in loaded]
            for id, session, name, screenshot in asked:
                results[name] = self._problems(self.result(id, "Runtime.evaluate"), session)
                if screenshot:
                    shot = self.call("Page.captureScreenshot", {"format": "png"}, session=session)
                    with open(screenshot, "wb") as f:
                        f.write(base64.b64decode(shot["data"]))
        return results

    @staticmethod
    def _event(session, method, name=None, frame=None):
        """A test for check's waits: an event of `session` (a lifecycle event `name` of `frame`)."""
        return lambda e: e.get("sessionId") == session and e["method"] == method and (
            name is None or (e["params"].get("name") == name and e["params"].get("frameId") == frame))

    def _problems(self, report, session):
        """The problems of one page: from the events of its session and PAGE_REPORT's answer."""
        if "exceptionDetails" in report:
            return [f"the check's own script failed: {report['exceptionDetails'].get('text')}"]
        page = report["result"]["value"]
        problems = [describe_event(e) for e in self.events if e.get("sessionId") == session]
        problems = [p for p in problems if p]
        problems += [f"image not loaded: {src}" for src in page["brokenImages"]]
        problems += [f"SVG object not rendered: {data}" for data in page["brokenObjects"]]
        problems += [f"picture wider than its text column, cut off: {name}"
                     for name in page["clippedPictures"]]
        if page["hasNavTree"] and page["navItems"] == 0:
            problems.append("the navigation tree on the left is empty (its scripts did not fill it)")
        return problems

    def close(self):
        """Asks Chromium to quit, then ends its process group if it has not within 5 s."""
        if self.pid is not None:
            try:
                os.write(self.to_browser, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            except OSError:
                pass
            deadline = time.monotonic() + 5
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT  # reaped below, after the group is ended
            while time.monotonic() < deadline and os.waitid(os.P_PID, self.pid, flags) is None:
                time.sleep(0.05)
            try:  # its helpers, and itself if it has not quit
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            self.pid = None
        for fd in ("to_browser", "from_browser"):
            if getattr(self, fd, None) is not None:
                os.close(getattr(self, fd))
                setattr(self, fd, None)
        shutil.rmtree(self.profile, ignore_errors=True)


def describe_event(event):
    """A line for an event that reports an error in the page, or None for any other event."""
    method, params = event["method"], event.get("params", {})
    if method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        text = details.get("exception", {}).get("description") or details.get("text", "")
        where = f"{details.get('url', '')}:{details.get('lineNumber', -1) + 1}"
        return f"JavaScript exception at {where}: {text.splitlines()[0] if text else '?'}"
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
        return f"console.{params['type']}: {args}"
    if method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        return f"browser log error: {entry.get('text', '')} {entry.get('url', '')}".rstrip()
    return None
