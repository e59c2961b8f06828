#!/usr/bin/env python3
"""Checks the generated docs site, first as files and then in a headless Chromium.

The static pass reads every HTML page of the site and every script of Doxygen's navigation tree
and search index: each local link must name a file inside the site, and each #fragment an id or
an anchor name on the page it points at; each image (<img>, or an SVG in an <object>) must exist,
be non-empty and, for an SVG, be well-formed XML with an <svg> root. Each page of docs/pages must
show, in full, every output it embeds (`\\verbinclude`, as the program printed it) and every image
it shows (`\\image html`); each region of a program it quotes (`\\snippet FILE name`: the lines
between two "// [name]" lines) must exist and hold no other region's marker line, which the page
would show raw.

Each page of the learning path (from getting_started along its "Next:" links to the reference
shelf) keeps its measurements in one "Measured" box: a path into bench/results, a machine's
letter or a commit id outside it fails, as do two boxes, a long one, or a concept page without.
A concept page without a figure (a picture in its contents, outside its box) fails too.

The browser pass drives a headless Chromium with Selenium, through chromedriver (Debian:
python3-selenium, chromium-driver). It opens every page of docs/pages in turn at 1400 px, and
every page of the learning path again in the dark theme and both themes at 420 px (VIEWS), and
fails on an uncaught JavaScript exception, a console error, a resource that did not load, an
image or SVG that did not render, a picture cut off (wider than its text column, or an SVG
without a viewBox shown narrower than drawn), a theme not shown as asked, or an empty navigation
tree or a title it cuts off. At 1400 px each picture must be shown at least as wide as it was drawn and each SVG label
at least 9 px as shown; each SVG, opened alone, must have no label past its edges. It saves
screenshots of the pages named by --screenshot. --self-test plants each fault and fails unless
each is caught.

Exit status: 0 when all is well; 1 with one line per problem; 77 (CTest: skipped) when the site
has not been built, or when Chromium, chromedriver or Selenium is not installed (after the static
pass has passed), unless KVLAB_REQUIRE_BROWSER=1, when a missing browser is a failure. Standard
library only, but for Selenium in the browser pass.

The site, its .md pages (under INPUT) and the folders of the embedded outputs (EXAMPLE_PATH) are
read from the Doxyfile that built it.

usage: check_site.py --doxyfile build/docs/Doxyfile [--html DIR] [--screenshot PAGE.html=OUT.png]...
                     [--static-only] [--chromium PATH] [--chromedriver PATH]
       check_site.py --self-test
"""
import argparse
import json
import os
import re
import shlex
import shutil
import struct
import sys
import time
import xml.etree.ElementTree as ElementTree
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

SKIPPED = 77
# The attributes through which a page loads or links another file.
LINK_ATTRIBUTES = {("a", "href"), ("area", "href"), ("link", "href"), ("script", "src"),
                   ("img", "src"), ("iframe", "src"), ("object", "data"), ("embed", "src"),
                   ("source", "src")}
IMAGE_ATTRIBUTES = {("img", "src"), ("object", "data"), ("embed", "src")}


class Page(HTMLParser):
    """What the checks need from one HTML file: its ids and anchor names, its links with their
    line numbers, its images, the text of each <pre class="fragment"> (an embedded output), and
    the anchors of its member rows (<tr class="memitem:ANCHOR">: Doxygen's navigation tree links
    a file's members there, and its script highlights the row)."""

    def __init__(self, path):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.images, self.outputs = set(), [], [], []
        self.rows = set()
        self._output = None
        # The text of the page's contents (<div class="contents">), outside and inside its
        # "Measured" boxes (<div class="measured">): one string per box.
        self.text, self.boxes = [], []
        self.figures = []  # the pictures of its contents, outside the boxes
        self._divs = []  # for each open <div>: "contents", "measured" or None
        self.feed(path.read_text(encoding="utf-8", errors="replace"))
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(name):
                self.ids.add(attrs[name])
        for attr in (a for t, a in LINK_ATTRIBUTES if t == tag):
            if attrs.get(attr):
                self.links.append((self.getpos()[0], attrs[attr]))
                if (tag, attr) in IMAGE_ATTRIBUTES:
                    self.images.append(attrs[attr])
                    if "contents" in self._divs and "measured" not in self._divs:
                        self.figures.append(attrs[attr])
        classes = (attrs.get("class") or "").split()
        if tag == "div":
            kind = next((c for c in ("contents", "measured") if c in classes), None)
            self._divs.append(kind)
            if kind == "measured":
                self.boxes.append([])
        if tag == "pre" and "fragment" in classes:
            self._output = []
        if tag == "tr":
            self.rows.update(c[len("memitem:"):] for c in classes if c.startswith("memitem:"))

    def handle_endtag(self, tag):
        if tag == "div" and self._divs:
            self._divs.pop()
        if tag == "pre" and self._output is not None:
            self.outputs.append("".join(self._output))
            self._output = None

    def handle_data(self, data):
        if self._output is not None:
            self._output.append(data)
        if "measured" in self._divs:
            self.boxes[-1].append(data)
        elif "contents" in self._divs:
            self.text.append(data)


def is_local(url):
    parts = urlsplit(url)
    return not parts.scheme and not parts.netloc


def lines_of(text):
    """Text as a list of lines without trailing spaces, leading and trailing empty lines dropped."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


class Site:
    """The static pass over one generated site."""

    def __init__(self, root):
        self.root = root.resolve()
        self.pages = {p: Page(p) for p in sorted(self.root.rglob("*.html"))}
        self.problems = []
        self.tolerated = []  # (what, where): Doxygen's own links without a target, not failed on

    def name(self, path):
        return str(path.relative_to(self.root))

    def check_link(self, source, line, url, rows=False):
        """One local link from `source` (a file of the site): the file and the fragment exist;
        with `rows`, a member row's anchor counts as a fragment's target."""
        parts = urlsplit(url)
        where = f"{self.name(source)}:{line}: link '{url}'"
        target = (source.parent / unquote(parts.path)).resolve() if parts.path else source
        if not target.is_relative_to(self.root):
            self.problems.append(f"{where} points outside the site ({target})")
        elif not target.is_file():
            self.problems.append(f"{where}: no file {self.name(target)}")
        elif parts.fragment and target.suffix == ".html":
            page = self.pages.get(target)
            fragment = unquote(parts.fragment)
            if page is None or fragment in page.ids or (rows and fragment in page.rows):
                return
            if fragment == "nested-classes" and source == target:
                # Doxygen 1.9.4 puts a "Classes" link in the summary of a class whose nested
                # classes are all private (not shown), with no section for it to point at.
                self.tolerated.append(("'Classes' links of classes whose nested classes are all "
                                       "private", where))
            elif rows and re.fullmatch(r"a[0-9a-f]{32}a[0-9a-f]{32}", fragment) and \
                    fragment[:33] in page.rows:
                # An enumerator under a file in Doxygen's navigation tree: it points at the file's
                # page, which lists the enum (that row is there) but documents its values on
                # the namespace's page.
                self.tolerated.append(("enumerators under a file in the navigation tree", where))
            else:
                self.problems.append(f"{where}: {self.name(target)} has no id or anchor "
                                     f"'{parts.fragment}'")

    def check_links(self):
        for path, page in self.pages.items():
            for line, url in page.links:
                if is_local(url) and url != "#":
                    self.check_link(path, line, url)
        # Doxygen's navigation tree and search index are data in scripts: "page.html#anchor".
        quoted = re.compile(r"""["']([^"'\s<>]+\.html(?:#[^"'\s<>]*)?)["']""")
        scripts = [p for p in self.root.rglob("*.js") if p.name.startswith("navtree")
                   or p.parent.name == "search" or (self.root / (p.stem + ".html")).is_file()]
        for path in sorted(scripts):
            for number, text in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                          .splitlines(), 1):
                for url in quoted.findall(text):
                    if is_local(url):
                        self.check_link(path, number, url, rows=True)

    def check_images(self):
        seen = set()
        for path, page in self.pages.items():
            for url in page.images:
                if not is_local(url):
                    continue
                image = (path.parent / unquote(urlsplit(url).path)).resolve()
                if image in seen or not image.is_file():  # a missing file is a broken link above
                    continue
                seen.add(image)
                if image.stat().st_size == 0:
                    self.problems.append(f"{self.name(path)}: image {url} is empty")
                elif image.suffix == ".svg":
                    try:
                        root = ElementTree.parse(image).getroot()
                        if root.tag.rsplit("}", 1)[-1] != "svg":
                            self.problems.append(f"{self.name(path)}: image {url} has root "
                                                 f"<{root.tag}>, not <svg>")
                    except ElementTree.ParseError as e:
                        self.problems.append(f"{self.name(path)}: image {url} is not "
                                             f"well-formed SVG: {e}")

    def check_embedded(self, sources, example_dirs):
        """Each page made from a .md page shows every output it \\verbinclude-s and image it shows."""
        for name, source in sources.items():
            text = source.read_text(encoding="utf-8")
            html = self.root / name
            page = self.pages.get(html)
            if page is None:
                self.problems.append(f"{source.name}: its page {name} was not generated")
                continue
            shown = {fragment for fragment in (tuple(lines_of(o)) for o in page.outputs)}
            for included in re.findall(r"^[ \t]*[\\@]verbinclude[ \t]+(\S+)", text, re.M):
                found = [Path(d) / included for d in example_dirs if (Path(d) / included).is_file()]
                if not found:
                    self.problems.append(f"{self.name(html)}: embeds {included}, which is in none "
                                         f"of {', '.join(map(str, example_dirs))}")
                    continue
                expected = tuple(lines_of(found[0].read_text(encoding="utf-8", errors="replace")))
                if not expected:
                    self.problems.append(f"{self.name(html)}: the output it embeds, {found[0]}, "
                                         "is empty")
                elif expected not in shown:
                    self.problems.append(f"{self.name(html)}: does not show {included} in full "
                                         f"({len(expected)} lines from {found[0]})")
            for file, marker in re.findall(r"^[ \t]*[\\@]snippet[ \t]+(\S+)[ \t]+(\S+)", text,
                                           re.M):
                found = [Path(d) / file for d in example_dirs if (Path(d) / file).is_file()]
                if found:
                    self.problems.extend(f"{self.name(html)}: {problem}"
                                         for problem in snippet_problems(found[0], marker))
            for image in re.findall(r"^[ \t]*[\\@]image[ \t]+html[ \t]+(\S+)", text, re.M):
                if image not in page.images:
                    self.problems.append(f"{self.name(html)}: does not show the image {image}")


# What a page of the learning path keeps in its "Measured" box: a path into bench/results, a
# machine's letter ("machine C") or a commit id (7 to 40 hex digits, at least one a-f and one 0-9,
# not the digits of a number such as 9.983778e-07).
BENCH_DETAIL = [
    ("a path into bench/results", re.compile(r"bench/results")),
    ("a machine's letter", re.compile(r"\b[Mm]achines? [A-H]\b")),
    ("a commit id", re.compile(r"(?<![.\w])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b(?![-+]\d)")),
]
MEASURED_WORDS = 90  # a box is short: one measured number, its machine and a link


def path_pages(sources):
    """The pages of the learning path, in order: from getting_started along each page's last
    "Next: \\ref NAME" to the first page of the index's "### Reference" list (not included)."""
    index = sources.get("index.html")
    shelf = ""
    if index is not None:
        reference = index.read_text(encoding="utf-8").partition("### Reference")[2]
        first = re.search(r"\\subpage[ \t]+([\w-]+)", reference)
        shelf = first.group(1) if first else ""
    order, name = [], "getting_started"
    while name and name != shelf and name + ".html" in sources and name not in order:
        order.append(name)
        nexts = re.findall(r"^Next:[ \t]*\\ref[ \t]+([\w-]+)",
                           sources[name + ".html"].read_text(encoding="utf-8"), re.M)
        name = nexts[-1] if nexts else ""
    return order


def measurement_problems(name, page):
    """What is wrong with where page `name` of the learning path keeps its measurements: bench
    detail (BENCH_DETAIL) outside its "Measured" box, more than one box, a box longer than
    MEASURED_WORDS words, or a concept page (concept_*) without a box or without a figure (the
    picture of its idea)."""
    problems = []
    text = " ".join("".join(page.text).split())
    for what, pattern in BENCH_DETAIL:
        for match in pattern.finditer(text):
            context = text[max(0, match.start() - 50):match.end() + 30]
            problems.append(f"{name}.html: {what} outside its Measured box: '...{context}...'")
    if len(page.boxes) > 1:
        problems.append(f"{name}.html: {len(page.boxes)} Measured boxes; a page keeps one")
    if name.startswith("concept_") and not page.boxes:
        problems.append(f"{name}.html: no Measured box (a concept page keeps one measured number "
                        "in one)")
    if name.startswith("concept_") and not page.figures:
        problems.append(f"{name}.html: no figure (a concept page shows its idea in a picture)")
    for box in page.boxes:
        words = len("".join(box).split())
        if words > MEASURED_WORDS:
            problems.append(f"{name}.html: its Measured box has {words} words, more than "
                            f"{MEASURED_WORDS}")
    return problems


def self_test():
    """Plants each fault the checks of this file are meant to catch in a small page of its own
    and fails unless each is caught, and a clean page passes: a check that cannot fail proves
    nothing. Returns the list of problems with the checks themselves (empty when all is well)."""
    import tempfile
    box = '<div class="measured"><b>Measured</b> (machine C, bench/results/x.txt, 5198894 at cc14b39)</div>'
    body = '<div class="contents"><p>{}</p>{}</div>'
    cases = [  # (what is planted, page name, its contents, the words a problem must hold)
        ("nothing", "concept_clean",
         body.format('The cache keeps K and V.</p><div class="image"><img src="x.svg"/></div><p>',
                     box), None),
        ("a concept page without a figure", "concept_x", body.format("The idea.", box),
         "no figure"),
        ("a path into bench/results", "tutorial_x", body.format("see bench/results/README.md", ""),
         "a path into bench/results"),
        ("a machine's letter", "tutorial_x", body.format("on Machine D, 2 cores", ""),
         "a machine's letter"),
        ("a commit id", "tutorial_x", body.format("the kernels of commit cc14b39", ""),
         "a commit id"),
        ("a number in e-notation (no fault)", "tutorial_x", body.format("an error of 9.983778e-07", ""),
         None),
        ("a concept page without a box", "concept_x", body.format("The idea.", ""),
         "no Measured box"),
        ("two boxes", "tutorial_x", body.format("Two.", box + box), "2 Measured boxes"),
        ("a long box", "tutorial_x",
         body.format("", '<div class="measured">' + "word " * (MEASURED_WORDS + 1) + "</div>"),
         "more than"),
    ]
    failures = []
    # The pictures' rules on measured answers: (what is planted, pictures, measured, words).
    url = "file:///site/x.svg"
    fine = {"natural": 700, "text": 3, "smallest": 12, "clipped": []}
    shown = lambda width, natural: {"page.html": [{"src": "x.svg", "url": url, "width": width,
                                                   "natural": natural}]}
    picture_cases = [
        ("nothing", shown(700, 700), {url: fine}, None),
        ("a picture shown narrower than drawn", shown(500, 700), {url: fine},
         "narrower than drawn"),
        ("a label of 8 px as shown", shown(700, 700), {url: dict(fine, smallest=8)},
         "smallest label is 8.0 px"),
        ("a label cut off at an edge", shown(700, 700), {url: dict(fine, clipped=["budget 4096"])},
         "run past its edges"),
    ]
    for what, pictures, measured, expected in picture_cases:
        found = picture_problems(pictures, measured)
        if expected is None and found:
            failures.append(f"self-test: {what}: reported {found}")
        elif expected is not None and not any(expected in f for f in found):
            failures.append(f"self-test: {what}: not caught (reported {found or 'nothing'})")
    with tempfile.TemporaryDirectory() as tmp:
        for what, name, contents, expected in cases:
            path = Path(tmp) / (name + ".html")
            path.write_text(f"<html><body>{contents}</body></html>", encoding="utf-8")
            found = measurement_problems(name, Page(path))
            if expected is None and found:
                failures.append(f"self-test: {what}: reported {found}")
            elif expected is not None and not any(expected in f for f in found):
                failures.append(f"self-test: {what}: not caught (reported {found or 'nothing'})")
    return failures


def browser_self_test(chromium, chromedriver, webdriver):
    """Plants the pictures' faults in a page of their own, shown in Chromium as the site's pages
    are, and returns the problems with the checks (empty when each fault is caught and a clean
    picture passes): the measuring scripts are checked, not only the rules."""
    import tempfile
    svgs = {  # name: (SVG, the words its problem must hold, or None for none)
        "clean.svg": ('<svg xmlns="http://www.w3.org/2000/svg" width="300" height="60" '
                      'viewBox="0 0 300 60" font-size="12"><text x="10" y="30">fine</text></svg>',
                      None),
        "wide.svg": ('<svg xmlns="http://www.w3.org/2000/svg" width="3000" height="60" '
                     'viewBox="0 0 3000 60" font-size="40"><text x="10" y="40">wide</text></svg>',
                     "narrower than drawn"),
        "small.svg": ('<svg xmlns="http://www.w3.org/2000/svg" width="300" height="60" '
                      'viewBox="0 0 300 60" font-size="7"><text x="10" y="30">small</text></svg>',
                      "smallest label"),
        "clipped.svg": ('<svg xmlns="http://www.w3.org/2000/svg" width="300" height="60" '
                        'viewBox="0 0 300 60" font-size="12"><text x="250" y="30">a label cut '
                        'off at the edge</text></svg>', "run past its edges"),
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        images = ""
        for name, (svg, _) in svgs.items():
            (Path(tmp) / name).write_text(svg, encoding="utf-8")
            images += (f'<div class="image"><object type="image/svg+xml" data="{name}"></object>'
                       '</div>\n')
        page = Path(tmp) / "page.html"
        # (docs/kvlab.css's rule: a picture wider than the column is scaled down to it)
        page.write_text('<html><head><style>div.image object { max-width: 100%; height: auto }'
                        f'</style></head><body><div class="contents" style="width:700px">{images}'
                        '</div></body></html>', encoding="utf-8")
        dark = Path(tmp) / "dark.html"  # the dark theme: one picture inverted, one not
        dark.write_text('<html class="dark-mode"><body><div class="contents">'
                        '<div class="image"><img src="clean.svg" style="filter: invert(1)"/></div>'
                        '<div class="image"><img src="bright.svg"/></div></div></body></html>',
                        encoding="utf-8")
        (Path(tmp) / "bright.svg").write_text(svgs["clean.svg"][0], encoding="utf-8")
        nav = Path(tmp) / "nav.html"  # a navigation tree 120 px wide, a title it cuts off
        nav.write_text('<html><body><div id="nav-tree" style="width:120px;overflow:hidden">'
                       '<div id="nav-tree-contents"><ul><li><span class="label" '
                       'style="white-space:nowrap">Tutorial 99: a title far too long to show</span>'
                       '</li></ul></div></div></body></html>', encoding="utf-8")
        try:
            with Browser(webdriver, chromium, chromedriver) as browser:
                found = browser.check([("page.html", page.as_uri(), None),
                                       ("nav.html", nav.as_uri(), None),
                                       ("dark.html", dark.as_uri(), None)])
                dark_found = [p for p in found["dark.html"] if "unfiltered" in p]
                if len(dark_found) != 1 or "bright.svg" not in dark_found[0]:
                    failures.append("browser self-test: a picture unfiltered in the dark theme: "
                                    f"expected bright.svg alone, reported {dark_found or 'nothing'}")
                failures += [f"browser self-test: the clean page: {p}" for p in found["page.html"]]
                if not any("cuts the title 'Tutorial 99" in p for p in found["nav.html"]):
                    failures.append("browser self-test: a title the navigation tree cuts off: not "
                                    f"caught (reported {found['nav.html'] or 'nothing'})")
                urls = sorted({p["url"] for p in browser.pictures["page.html"]})
                problems = picture_problems({"page.html": browser.pictures["page.html"]},
                                            browser.measure_svgs(urls))
        except BrowserError as e:
            return [f"browser self-test: Chromium: {e}"]
    for name, (_, expected) in svgs.items():
        mine = [p for p in problems if name in p]
        if expected is None and mine:
            failures.append(f"browser self-test: {name}: reported {mine}")
        elif expected is not None and not any(expected in p for p in mine):
            failures.append(f"browser self-test: {name}: not caught (reported {mine or 'nothing'})")
    return failures


# A line that is only a snippet marker: "// [name]" (and whatever follows it on the line).
MARKER_LINE = re.compile(r"^[ \t]*//[ \t]*\[([A-Za-z0-9_]+)\]")


def snippet_problems(source, marker):
    """What is wrong with the region `\\snippet source marker` quotes: the lines between the first
    two lines marked "// [marker]". A region that holds another marker's line would show that raw
    line on the page (and usually another region with it); a marker found fewer than twice quotes
    nothing."""
    lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    marked = [i for i, line in enumerate(lines)
              if (m := MARKER_LINE.match(line)) and m.group(1) == marker.strip("[]")]
    if len(marked) < 2:
        return [f"\\snippet {source.name} {marker}: the marker is on {len(marked)} line(s), "
                "not 2"]
    inside = [lines[i].strip() for i in range(marked[0] + 1, marked[1]) if MARKER_LINE.match(lines[i])]
    return [f"\\snippet {source.name} {marker}: quotes the marker line '{line}'" for line in inside]


def read_doxyfile(path):
    """The settings of a Doxyfile: {"INPUT": ["/a", "/b"], ...} (values split as a shell would)."""
    settings, text = {}, path.read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        match = re.match(r"\s*([A-Z_]+)\s*(\+?=)(.*)", line)
        if match:
            key, op, value = match.groups()
            values = shlex.split(value, comments=False, posix=True)
            settings[key] = (settings.get(key, []) if op == "+=" else []) + values
    return settings


def page_sources(inputs):
    """The site's page for each .md page under `inputs`, by the anchor of its title:
    {"tutorial_03.html": .../03_paged_cache.md, "index.html": .../00_index.md, ...}."""
    sources = {}
    files = [Path(i) for i in inputs if Path(i).is_file()]
    files += [p for i in inputs if Path(i).is_dir() for p in Path(i).rglob("*.md")]
    for source in sorted(f for f in files if f.suffix == ".md"):
        anchor = re.search(r"^#[^\n]*\{#([\w-]+)\}", source.read_text(encoding="utf-8"), re.M)
        if anchor:
            name = anchor.group(1)
            sources["index.html" if name == "mainpage" else name + ".html"] = source
    return sources


def find_program(given, names):
    """The path of `given`, or of the first of `names` on the PATH; None if there is none."""
    for name in [given] if given else names:
        path = shutil.which(name)
        if path:
            return path
    return None


def load_webdriver():
    """Selenium's webdriver package, or the reason it cannot be imported (a string). Debian's
    python3-selenium is installed for the system's python3: the CTest runs this script with it
    where CMake's Python lacks Selenium (docs/CMakeLists.txt)."""
    try:
        from selenium import webdriver
        return webdriver
    except ImportError as e:
        return f"{sys.executable}: {e}"


def failure(e):
    """The message of one of Browser.failures: chromedriver's, without Selenium's stack trace."""
    return getattr(e, "msg", None) or str(e)


def png_size(path):
    """(width, height) from a PNG file's header, or None if it is not a PNG."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


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
  // Each picture's width as shown and as drawn (an SVG's width attribute, in px; else its
  // viewBox's), for the check that none is shown narrower than drawn, its text shrunk.
  const drawn = svg => {
    const w = svg.getAttribute('width'), vb = svg.viewBox && svg.viewBox.baseVal;
    if (w && /pt$/.test(w)) return parseFloat(w) * 4 / 3;
    if (w && !/%$/.test(w)) return parseFloat(w);
    return vb && vb.width ? vb.width : 0;
  };
  const pictures = [...document.querySelectorAll('div.image img, div.image object')].map(p => {
    const svg = p.localName === 'object' && p.contentDocument && p.contentDocument.documentElement;
    return {src: p.getAttribute('src') || p.getAttribute('data'), url: p.src || p.data,
            width: p.getBoundingClientRect().width,
            natural: svg && svg.localName === 'svg' ? drawn(svg) : (p.naturalWidth || 0),
            filter: getComputedStyle(p).filter};
  });
  // A title of the navigation tree cut off at its right edge (the tree shows whole titles).
  const tree = document.getElementById('nav-tree');
  const treeRight = tree ? tree.getBoundingClientRect().right : 0;
  const cutTitles = tree && tree.getBoundingClientRect().width > 0 ?
      [...document.querySelectorAll('#nav-tree-contents .label')]
        .filter(l => l.textContent.trim() && l.getBoundingClientRect().right > treeRight - 2)
        .map(l => l.textContent.trim()) : [];
  return {title: document.title, hasNavTree: !!document.getElementById('nav-tree'),
          navItems: navItems(), brokenImages, brokenObjects, clippedPictures, pictures, cutTitles,
          darkToggle: typeof DoxygenAwesomeDarkModeToggle !== 'undefined',
          dark: document.documentElement.classList.contains('dark-mode')};
})()
""".strip()  # "return" and the expression on one line: a line break after it would return nothing

# Run in an SVG opened alone: its drawn width, its labels' smallest font size in px (the size
# times the scale of the label's own coordinates) and the labels that run past its edges.
SVG_REPORT = r"""
(() => {
  const svg = document.documentElement;
  if (svg.localName !== 'svg') return {error: 'not an SVG'};
  const root = svg.getBoundingClientRect();
  const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim() !== '');
  let smallest = Infinity;
  const clipped = [];
  for (const t of texts) {
    const m = t.getScreenCTM(), size = parseFloat(getComputedStyle(t).fontSize);
    if (m && size > 0) smallest = Math.min(smallest, size * Math.hypot(m.a, m.b));
    const b = t.getBoundingClientRect();
    if (b.width > 0 && (b.left < root.left - 0.5 || b.right > root.right + 0.5 ||
                        b.top < root.top - 0.5 || b.bottom > root.bottom + 0.5))
      clipped.push(t.textContent.trim().slice(0, 60));
  }
  return {natural: root.width, text: texts.length, smallest: texts.length ? smallest : 0, clipped};
})()
""".strip()
SMALLEST_TEXT_PX = 9  # a label shown smaller than this, at the column's width, is not read


class BrowserError(Exception):
    """The browser or chromedriver did not start, died, or did not answer in time."""


class Browser:
    """One headless Chromium driven by Selenium through chromedriver; use as a context manager, so
    that both always end. Chromedriver keeps two logs of the tab: the browser's log (uncaught
    exceptions, console errors, failed loads) and the DevTools events of its Network domain (the
    "performance" log), from which the pass learns when a page's loads are over."""

    def __init__(self, webdriver, chromium, chromedriver, width=1400, height=1000, timeout=20.0,
                 dark=False):
        import urllib3
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.remote.remote_connection import RemoteConnection
        self.webdriver, self.chromium, self.chromedriver = webdriver, chromium, chromedriver
        # What a command to chromedriver raises when it, or the browser, fails or does not
        # answer: chromedriver's error, or one of the HTTP connection to it (a timeout: urllib3's).
        self.failures = (WebDriverException, OSError, urllib3.exceptions.HTTPError)
        self.width, self.height, self.timeout, self.dark = width, height, timeout, dark
        self.driver = None
        # Every command has a deadline (a page's load the longest), so a hung browser or
        # chromedriver fails the check instead of hanging it.
        RemoteConnection.set_timeout(timeout + 10)
        self._start()

    def _start(self):
        from selenium.webdriver.chrome.service import Service
        options = self.webdriver.ChromeOptions()
        options.binary_location = self.chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--window-size={self.width},{self.height}", "--no-first-run",
                    "--no-default-browser-check", "--disable-extensions",
                    "--disable-background-networking", "--disable-sync",
                    "--disable-component-update", "--allow-file-access-from-files"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        options.add_experimental_option("perfLoggingPrefs", {"enableNetwork": True,
                                                             "enablePage": False})
        try:
            # An explicit chromedriver: Selenium never looks for (or downloads) one of its own.
            self.driver = self.webdriver.Chrome(
                service=Service(executable_path=self.chromedriver), options=options)
        except self.failures as e:
            raise BrowserError(f"could not start it through {self.chromedriver}: "
                               f"{failure(e)}") from e
        try:
            self.driver.set_page_load_timeout(self.timeout)
            self.driver.set_script_timeout(self.timeout)
            # The viewport itself, not the window around it, at width x height (the screenshots').
            self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                "width": self.width, "height": self.height, "deviceScaleFactor": 1,
                "mobile": False})
            # The reader's theme, as the system asks for it: doxygen-awesome-css's dark-mode
            # toggle follows prefers-color-scheme (until the reader toggles it).
            self.driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [
                {"name": "prefers-color-scheme", "value": "dark" if self.dark else "light"}]})
        except self.failures as e:
            self.close()
            raise BrowserError(f"it did not answer: {failure(e)}") from e

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Ends Chromium and chromedriver."""
        if self.driver is not None:
            try:
                self.driver.quit()
            except self.failures:
                pass  # quit() stops chromedriver, and so Chromium, even when the browser hung
            self.driver = None

    def _events(self):
        """The DevTools events chromedriver recorded since the last call."""
        return [json.loads(e["message"])["message"] for e in self.driver.get_log("performance")]

    def check(self, pages):
        """Loads each (name, url, screenshot or None) of `pages` in turn; returns {name: [problem,
        ...]} with an empty list for a page that showed none, and writes a PNG of the viewport to
        each page's `screenshot`. Every wait has its own deadline: a page's load (`timeout`), then
        its loads settling (3 s) and its navigation tree (3 s); a page that did not load in time
        (its scripts may be stuck) is left with its browser: the next page opens in a new one."""
        from selenium.common.exceptions import JavascriptException, TimeoutException
        results, previous = {}, None
        self.pictures = {}  # page name -> [{src, url, width, natural}] of its pictures
        try:
            for name, url, screenshot in pages:
                # What the previous page logged after its report (a late exception) is its own.
                self._log(results, previous)
                self._events()
                previous, problems = name, results.setdefault(name, [])
                try:
                    self.driver.get(url)
                except TimeoutException:
                    problems.append(f"it did not finish loading within {self.timeout:g} s")
                    previous = None
                    self.close()
                    self._start()
                    continue
                frame = self.driver.execute_cdp_cmd("Page.getFrameTree", {})["frameTree"]["frame"]
                events = self._events()
                if frame.get("unreachableUrl"):
                    failed = [e["params"].get("errorText") for e in events
                              if e["method"] == "Network.loadingFailed"
                              and e["params"].get("type") == "Document"]
                    problems.append(f"it did not open: {failed[-1] if failed else frame['url']}")
                    continue
                self._settle(events)
                try:
                    report = self.driver.execute_script("return " + PAGE_REPORT)
                    problems += describe_report(report, self.dark)
                    self.pictures[name] = report["pictures"]
                except JavascriptException as e:
                    problems.append(f"the check's own script failed: {e.msg}")
                if screenshot:
                    with open(screenshot, "wb") as f:
                        f.write(self.driver.get_screenshot_as_png())
            self._log(results, previous)
        except self.failures as e:
            raise BrowserError(f"it died or did not answer: {failure(e)}") from e
        return results

    def measure_svgs(self, urls):
        """Opens each SVG of `urls` alone, at the size it was drawn, and returns {url: {"natural":
        its width in px, "text": its labels, "smallest": the smallest label's font size in px,
        "clipped": the labels that run past its edges}} (an entry {"error": ...} where it did
        not open). Text drawn as paths has no label to measure: such an SVG has "text" 0."""
        from selenium.common.exceptions import JavascriptException, TimeoutException
        measured = {}
        try:
            for url in urls:
                try:
                    self.driver.get(url)
                    measured[url] = self.driver.execute_script("return " + SVG_REPORT)
                except (JavascriptException, TimeoutException) as e:
                    measured[url] = {"error": getattr(e, "msg", str(e))}
        except self.failures as e:
            raise BrowserError(f"it died or did not answer: {failure(e)}") from e
        return measured

    def _settle(self, events, quiet=0.2, limit=3.0):
        """Waits until the tab has no file loading and has started none for `quiet` s, or for at
        most `limit` s: the files that scripts load after the page's load event (the navigation
        tree's index, the search box's images, MathJax's parts) are in by then. `events`: the
        DevTools events since the page began to load. Chromium's own "networkIdle" would wait
        0.5 s after the last load, for every page."""
        pending, start = set(), time.monotonic()
        last = start
        while True:
            for event in events:
                method, request = event["method"], event["params"].get("requestId")
                if method == "Network.requestWillBeSent":
                    pending.add(request)
                elif method in ("Network.loadingFinished", "Network.loadingFailed"):
                    pending.discard(request)
                if method.startswith("Network."):
                    last = time.monotonic()
            now = time.monotonic()
            if (not pending and now - last >= quiet) or now - start >= limit:
                return
            time.sleep(0.05)
            events = self._events()

    def _log(self, results, name):
        """Adds the errors of the browser's log since the last call to page `name`'s problems."""
        problems = [describe_log_entry(e) for e in self.driver.get_log("browser")]
        if name is not None:
            results[name] += [p for p in problems if p]


def describe_report(page, dark=False):
    """The problems in PAGE_REPORT's answer; `dark`: the theme the browser asked for."""
    problems = [f"image not loaded: {src}" for src in page["brokenImages"]]
    if page["darkToggle"] and page["dark"] != dark:
        problems.append(f"asked for the {'dark' if dark else 'light'} theme, the page shows the "
                        f"{'dark' if page['dark'] else 'light'} one")
    problems += [f"SVG object not rendered: {data}" for data in page["brokenObjects"]]
    problems += [f"picture wider than its text column, cut off: {picture}"
                 for picture in page["clippedPictures"]]
    problems += [f"the navigation tree cuts the title '{title}' off" for title in page["cutTitles"]]
    # Every figure is drawn on white: in the dark theme one shown as drawn is a bright box
    # (docs/kvlab.css inverts them).
    if page["dark"]:
        problems += [f"picture shown unfiltered in the dark theme, a white box: {p['src']}"
                     for p in page["pictures"] if "invert" not in (p.get("filter") or "")]
    if page["hasNavTree"] and page["navItems"] == 0:
        problems.append("the navigation tree on the left is empty (its scripts did not fill it)")
    return problems


def describe_log_entry(entry):
    """A line for an entry of the browser's log that reports an error, or None for any other.

    Chromedriver writes an uncaught exception as "URL LINE:COLUMN Uncaught Error: ..." (LINE
    counted from 0), a console error as "URL LINE:COLUMN ARGUMENTS" (strings quoted), a failed
    load as "URL - Failed to load resource: net::ERR_...". It logs console.error and a failed
    console.assert alike, both at level SEVERE."""
    if entry.get("level") != "SEVERE":
        return None
    source, message = entry.get("source"), entry.get("message", "")
    located = re.match(r"(\S+) (\d+):\d+ (.*)", message, re.S)
    if source == "javascript":
        if not located:
            return f"JavaScript exception: {message.splitlines()[0] if message else '?'}"
        url, line, text = located.groups()
        text = text.removeprefix("Uncaught ").splitlines()
        return f"JavaScript exception at {url}:{int(line) + 1}: {text[0] if text else '?'}"
    if source == "console-api":
        text = located.group(3) if located else message
        try:  # a single string argument, unquoted as console.error wrote it
            value = json.loads(text)
            text = value if isinstance(value, str) else text
        except ValueError:
            pass
        return f"console error: {text}"
    if source == "network":
        url, _, text = message.partition(" - ")
        return f"browser log error: {text} {url}".rstrip()
    return f"browser log error: {message}"


def picture_problems(pictures, measured):
    """The problems of the pictures as the widest view shows them: `pictures` {page: [{src, url,
    width, natural}]} (PAGE_REPORT's), `measured` {url: SVG_REPORT's answer}. A picture shown
    narrower than drawn (its text shrinks with it), a label smaller than SMALLEST_TEXT_PX as
    shown, a label that runs past its SVG's edges (cut off where it is shown)."""
    problems, reported = [], set()
    for page in sorted(pictures):
        for picture in pictures[page]:
            src, shown, drawn = picture["src"], picture["width"], picture["natural"]
            m = measured.get(picture["url"], {})
            if "error" in m:
                problems.append(f"{page}: {src} did not open alone: {m['error']}")
                continue
            if drawn and shown < drawn - 1:
                problems.append(f"{page}: {src} is shown {shown:.0f} px wide, narrower than drawn "
                                f"({drawn:.0f} px): draw it at most {shown:.0f} px wide, or its "
                                "text shrinks with it")
            if m.get("text") and m.get("natural"):
                px = m["smallest"] * min(1.0, shown / m["natural"])
                if px < SMALLEST_TEXT_PX:
                    problems.append(f"{page}: {src}'s smallest label is {px:.1f} px as shown, "
                                    f"less than {SMALLEST_TEXT_PX} px")
            if m.get("clipped") and src not in reported:
                reported.add(src)
                problems.append(f"{src}: {len(m['clipped'])} label(s) run past its edges, cut off: "
                                + "; ".join(f"'{c}'" for c in m["clipped"][:3]))
    return problems


# The views every page of the learning path is opened in (width in px, dark theme); the first is
# also every other page's, the one the screenshots and the pictures' rules are taken in.
VIEWS = [(1400, False), (1400, True), (420, False), (420, True)]


def browse(html, page_names, screenshots, chromium, chromedriver, webdriver, path_names=None):
    """The browser pass; returns its problems. Every page in VIEWS[0]; the pages of
    `path_names` (default: all) in every view of VIEWS. The views run side by side, each in a
    browser of its own: a page's load is mostly waiting (for its files to settle), so four
    browsers take about a third of the time of one after the other. What each view prints comes
    out in VIEWS' order."""
    path_names = set(page_names if path_names is None else path_names)

    def view_pass(index):
        width, dark = VIEWS[index]
        problems, lines = [], []
        names = page_names if index == 0 else [n for n in page_names if n in path_names]
        view = f"{width} px, {'dark' if dark else 'light'}"
        pages = [(name, (html / name).resolve().as_uri(), screenshots.get(name) if index == 0
                  else None) for name in names]
        try:
            with Browser(webdriver, chromium, chromedriver, width=width, dark=dark) as browser:
                found_by_page = browser.check(pages)
                for name, found in sorted(found_by_page.items()):
                    problems += [f"{name} in Chromium ({view}): {p}" for p in found]
                    shot = ""
                    if index == 0 and name in screenshots:
                        size = png_size(screenshots[name])
                        if size != (browser.width, browser.height):
                            problems.append(f"{name}: the screenshot {screenshots[name]} is not a "
                                            f"{browser.width}x{browser.height} PNG (read: {size})")
                        shot = f", screenshot {screenshots[name]}"
                    if index == 0:
                        lines.append(f"  {name}: {len(found)} problem(s){shot}")
                if index == 0:
                    urls = sorted({p["url"] for ps in browser.pictures.values() for p in ps
                                   if p["url"].lower().endswith(".svg")})
                    measured = browser.measure_svgs(urls)
                    problems += picture_problems(browser.pictures, measured)
                    lines.append(f"  pictures: {sum(map(len, browser.pictures.values()))} shown, "
                                 f"{len(measured)} SVGs measured alone (labels cut off, smallest "
                                 f"label as shown >= {SMALLEST_TEXT_PX} px, none narrower than "
                                 "drawn)")
                else:
                    bad = sum(1 for f in found_by_page.values() if f)
                    lines.append(f"  {view}: {len(names)} pages of the learning path, {bad} with "
                                 "problems")
        except BrowserError as e:
            problems.append(f"Chromium ({chromium}, {view}): {e}")
        return problems, lines

    from concurrent.futures import ThreadPoolExecutor
    problems = []
    with ThreadPoolExecutor(max_workers=len(VIEWS)) as pool:
        for found, lines in pool.map(view_pass, range(len(VIEWS))):
            problems += found
            for line in lines:
                print(line)
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doxyfile", type=Path, 
                        help="the Doxyfile that built the site (build/docs/Doxyfile)")
    parser.add_argument("--html", type=Path, help="the site, if not the Doxyfile's")
    parser.add_argument("--screenshot", action="append", default=[], metavar="PAGE=PNG",
                        help="a page of the site to photograph, and where the PNG goes")
    parser.add_argument("--static-only", action="store_true", help="no browser pass")
    parser.add_argument("--self-test", action="store_true",
                        help="plant each fault the checks catch in a page of its own, and fail "
                             "unless each is caught (needs no site)")
    parser.add_argument("--chromium", help="the browser (default: chromium on the PATH)")
    parser.add_argument("--chromedriver",
                        help="Selenium's driver of it (default: chromedriver on the PATH)")
    args = parser.parse_args()
    if args.self_test:
        failures = self_test()
        chromium = find_program(args.chromium, ["chromium", "chromium-browser", "google-chrome"])
        chromedriver = find_program(args.chromedriver, ["chromedriver"])
        webdriver = load_webdriver()
        browser = chromium and chromedriver and not isinstance(webdriver, str)
        if browser:
            failures += browser_self_test(chromium, chromedriver, webdriver)
        print_problems(failures)
        print(f"check_site: self-test {'FAILED' if failures else 'passed'}"
              f"{'' if browser else ' (the file checks only: no Chromium, chromedriver or Selenium)'}")
        if not failures and not browser and os.environ.get("KVLAB_REQUIRE_BROWSER") != "1":
            return SKIPPED
        return 1 if failures or not browser else 0
    if args.doxyfile is None:
        parser.error("--doxyfile: expected the Doxyfile that built the site (or --self-test)")
    screenshots = {}
    for item in args.screenshot:
        page, sep, png = item.partition("=")
        if not sep or not page.endswith(".html") or not png.endswith(".png"):
            parser.error(f"--screenshot: expected PAGE.html=OUT.png, got '{item}'")
        screenshots[page] = png

    if not args.doxyfile.is_file():
        parser.error(f"--doxyfile: expected a Doxyfile, but {args.doxyfile} is not a file")
    doxyfile = read_doxyfile(args.doxyfile)
    html = args.html or (Path(doxyfile.get("OUTPUT_DIRECTORY", ["."])[0])
                         / doxyfile.get("HTML_OUTPUT", ["html"])[0])
    if not (html / "index.html").is_file():
        print(f"check_site: SKIPPED: no site at {html} (no index.html): build the 'docs' "
              "target first (cmake --build build --target docs)")
        return SKIPPED
    start = time.monotonic()
    site = Site(html)
    site.check_links()
    site.check_images()
    sources = page_sources(doxyfile.get("INPUT", []))
    site.check_embedded(sources, doxyfile.get("EXAMPLE_PATH", []))
    path = path_pages(sources)
    if len(path) < 2:
        site.problems.append(f"the learning path from getting_started has {len(path)} page(s): "
                             "expected the chain of 'Next: \\ref' lines")
    boxes = 0
    for name in path:
        page = site.pages.get(site.root / (name + ".html"))
        if page is not None:  # (a page not generated is reported above)
            site.problems += measurement_problems(name, page)
            boxes += len(page.boxes)
    print(f"check_site: the learning path: {len(path)} pages from {path[0] if path else '-'} to "
          f"{path[-1] if path else '-'}, {boxes} Measured boxes, bench detail outside them "
          "looked for")
    print(f"check_site: static pass over {len(site.pages)} pages of {html}: "
          f"{len(site.problems)} problem(s) ({time.monotonic() - start:.1f} s)")
    kinds = sorted({what for what, _ in site.tolerated})
    for what in kinds:
        where = [w for k, w in site.tolerated if k == what]
        print(f"check_site: not counted: {len(where)} link(s) that Doxygen 1.9 itself makes without "
              f"a target ({what}), e.g. {where[0]}")
    print_problems(site.problems)
    browser_problems = []
    if not args.static_only:
        chromium = find_program(args.chromium, ["chromium", "chromium-browser", "google-chrome"])
        chromedriver = find_program(args.chromedriver, ["chromedriver"])
        webdriver = load_webdriver()
        missing = []  # (what, its Debian package)
        if chromium is None:
            missing.append((f"'{args.chromium}'" if args.chromium else "chromium", "chromium"))
        if chromedriver is None:
            missing.append((f"'{args.chromedriver}'" if args.chromedriver else "chromedriver",
                            "chromium-driver"))
        if isinstance(webdriver, str):
            missing.append((f"Selenium ({webdriver})", "python3-selenium"))
        if missing:
            what = " and ".join(w for w, _ in missing)
            verb = "is" if len(missing) == 1 else "are"
            install = f"Debian: apt install {' '.join(p for _, p in missing)}"
            if site.problems or os.environ.get("KVLAB_REQUIRE_BROWSER") == "1":
                browser_problems.append(f"browser pass: {what} {verb} not installed ({install})")
            else:
                print(f"check_site: SKIPPED: the browser pass needs {what}, which {verb} not "
                      f"installed ({install}); the static pass passed")
                return SKIPPED
        else:
            for png in screenshots.values():
                Path(png).parent.mkdir(parents=True, exist_ok=True)
                if os.path.exists(png):
                    os.remove(png)  # no stale screenshot survives a failed run
            names = sorted(n for n in set(sources) | set(screenshots) if (html / n).is_file())
            browser_problems += [f"{n}, to be photographed, is not in the site"
                                 for n in screenshots if n not in names]
            start = time.monotonic()
            print(f"check_site: browser pass ({chromium} through {chromedriver}, Selenium "
                  f"{sys.modules['selenium'].__version__}), "
                  f"{len(names)} pages:")
            browser_problems += browse(html, names, screenshots, chromium, chromedriver, webdriver,
                                       [n + ".html" for n in path])
            print(f"check_site: browser pass: {len(browser_problems)} problem(s) "
                  f"({time.monotonic() - start:.1f} s)")
        print_problems(browser_problems)
    count = len(site.problems) + len(browser_problems)
    print(f"check_site: {f'FAILED, {count} problem(s)' if count else 'passed'}")
    return 1 if count else 0


def print_problems(problems, shown=60):
    """One line per problem, the first `shown` of them (a fault of the pages' template or
    scripts repeats on every page)."""
    for problem in problems[:shown]:
        print(f"check_site: {problem}")
    if len(problems) > shown:
        print(f"check_site: ... and {len(problems) - shown} more")


if __name__ == "__main__":
    sys.exit(main())
