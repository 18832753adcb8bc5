"""The documentation as a reader sees it: the built site, the snippets, the CLI.

The site is built with ``mkdocs build --strict`` (skipped, saying so, when
the ``docs`` extra is not installed) and every built page is parsed with
the standard library's ``html.parser``:

* one ``<h1>`` per page (a stray line starting with ``#`` inside a note box
  once rendered as a second title and emptied the table of contents);
* a table of contents listing every section (``<h2>``) of the page;
* no literal reStructuredText (``:func:``, ``:class:``, double backticks)
  and no unrendered Markdown (``**``, ``](``, backticks, a ``#`` heading
  mark) in the text outside code;
* every internal link, anchors included, points at a built page.

Every fenced ``python`` block in ``docs/**/*.md`` and ``README.md`` runs as
shown, on its own, in a fresh namespace. A block that is not meant to run
(signatures, code that needs another package) is marked as a fragment by
an HTML comment on the line just before its fence, which Markdown does not
render::

    <!-- fragment: why it does not run -->
    ```python
    ...
    ```

Blocks that include a file (``--8<-- "examples/x.py"``) are the example
scripts, which ``test_examples.py`` runs.
"""

from __future__ import annotations

import html.parser
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRAGMENT = "<!-- fragment"


# -- the built site -----------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip('mkdocs is not installed: install the docs extra (pip install -e ".[docs]")')
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


class Page(html.parser.HTMLParser):
    """What a reader sees of a built page: headings, TOC entries, prose, links, anchors."""

    _PROSE = {"p", "li", "td", "th", "h1", "h2", "h3", "h4", "dd", "dt", "summary"}

    def __init__(self, text: str):
        super().__init__()
        self.headings: list[tuple[str, str | None, str]] = []  # (tag, id, text)
        self.toc: list[str] = []  # the href="#..." of the page's table of contents
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.prose: list[str] = []  # text outside code, per block
        self._stack: list[tuple[str, dict]] = []
        self._code = 0  # depth of <code>/<pre>
        self._toc_depth = 0
        self._heading: tuple[str, str | None] | None = None
        self._heading_text: list[str] = []
        self._block: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("meta", "link", "img", "br", "hr", "input", "source"):  # void elements
            if "id" in a:
                self.ids.add(a["id"])
            return
        self._stack.append((tag, a))
        if "id" in a:
            self.ids.add(a["id"])
        if tag in ("code", "pre", "script", "style", "svg"):
            self._code += 1
        classes = a.get("class", "") or ""
        if tag == "nav" and "md-nav--secondary" in classes:
            self._toc_depth = len(self._stack)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
            if self._toc_depth and a["href"].startswith("#"):
                self.toc.append(a["href"][1:])
        if re.fullmatch(r"h[1-6]", tag):
            self._heading, self._heading_text = (tag, a.get("id")), []
        if tag in self._PROSE:
            self._block = []

    def handle_endtag(self, tag):
        while self._stack:
            open_tag, _ = self._stack.pop()
            if open_tag in ("code", "pre", "script", "style", "svg"):
                self._code -= 1
            if self._toc_depth and len(self._stack) < self._toc_depth:
                self._toc_depth = 0
            if open_tag == tag:
                break
        if self._heading and tag == self._heading[0]:
            self.headings.append((*self._heading, "".join(self._heading_text).replace("¶", "").strip()))
            self._heading = None
        if tag in self._PROSE and self._block:
            self.prose.append("".join(self._block))
            self._block = []

    def handle_data(self, data):
        if self._heading:
            self._heading_text.append(data)
        if not self._code:
            self._block.append(data)
        else:
            self._block.append(" ")


def _pages(site: Path) -> list[Path]:
    pages = [p for p in site.rglob("*.html") if p.name != "404.html"]
    assert len(pages) >= 10, pages
    return sorted(pages)


def _parse(path: Path) -> Page:
    return Page(path.read_text(encoding="utf-8"))


def test_every_page_has_one_title_and_a_complete_table_of_contents(site):
    for path in _pages(site):
        page = _parse(path)
        name = path.relative_to(site)
        titles = [text for tag, _, text in page.headings if tag == "h1"]
        assert len(titles) == 1, f"{name}: {len(titles)} <h1> headings: {titles}"
        sections = [hid for tag, hid, _ in page.headings if tag == "h2"]
        missing = [hid for hid in sections if hid not in page.toc]
        assert not missing, f"{name}: sections missing from the table of contents: {missing}"
        if sections:
            assert page.toc, f"{name}: has sections but an empty table of contents"


_RST = re.compile(r":(func|class|data|meth|attr|mod|obj|exc|ref):|``")
_MARKDOWN = re.compile(r"\*\*|\]\(|`|^\s*#{1,6}\s", re.MULTILINE)


def test_no_literal_rst_or_unrendered_markdown(site):
    problems = []
    for path in _pages(site):
        for block in _parse(path).prose:
            for pattern in (_RST, _MARKDOWN):
                m = pattern.search(block)
                if m:
                    start = max(0, m.start() - 40)
                    problems.append(f"{path.relative_to(site)}: {m.group()!r} in ...{block[start:m.end() + 40]!r}")
    assert not problems, "\n".join(problems)


def test_internal_links_resolve(site):
    ids = {path: _parse(path).ids for path in _pages(site)}
    broken = []
    for path in _pages(site):
        for href in _parse(path).links:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith("mailto:"):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir() or parts.path.endswith("/"):
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site)}: {href} (no {target})")
            elif parts.fragment and target.suffix == ".html" and target in ids:
                if parts.fragment not in ids[target]:
                    broken.append(f"{path.relative_to(site)}: {href} (no anchor #{parts.fragment})")
    assert not broken, "\n".join(broken)


def test_api_reference_links_to_the_caching_page(site):
    # "See docs/caching.md" was plain text in pejit's docstring.
    page = _parse(site / "api" / "index.html")
    assert any(urlsplit(href).path.rstrip("/").endswith("caching") for href in page.links)


def test_page_checks_catch_what_they_look_for():
    # The parser sees what the tests above assert on (a test that cannot fail is no test).
    page = Page(
        '<nav class="md-nav md-nav--secondary"><a href="#install">Install</a></nav>'
        '<h1 id="t">Title</h1><h2 id="install">Install</h2><h1 id="x">39103). Programs</h1>'
        "<p>See :func:`pejit` and **bold** and <code>``ok``</code></p>"
    )
    assert [t for tag, _, t in page.headings if tag == "h1"] == ["Title", "39103). Programs"]
    assert page.toc == ["install"]
    assert _RST.search(page.prose[-1]) and _MARKDOWN.search(page.prose[-1])
    assert "ok" not in page.prose[-1]


# -- the snippets ---------------------------------------------------------------
def _snippets() -> list:
    """``(file:line, source)`` of every runnable fenced python block."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"(\s*)```python\s*$", lines[i])
            if not m:
                i += 1
                continue
            indent, start = m.group(1), i
            previous = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i][len(indent):])
                i += 1
            i += 1
            source = "\n".join(body) + "\n"
            if previous.startswith(FRAGMENT) or source.lstrip().startswith("--8<--"):
                continue
            found.append(pytest.param(source, id=f"{path.relative_to(ROOT)}:{start + 1}"))
    return found


SNIPPETS = _snippets()


def test_snippets_are_found():
    ids = [p.id for p in SNIPPETS]
    assert any(i.startswith("README.md:") for i in ids)
    assert sum(i.startswith("docs/getting-started.md:") for i in ids) == 4, ids


@pytest.mark.parametrize("source", SNIPPETS)
def test_snippet_runs_as_shown(source):
    exec(compile(source, "<snippet>", "exec"), {"__name__": "__snippet__"})  # noqa: S102


# -- the command line and the package metadata --------------------------------------
def _pejit_cli(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pejit", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cli_help_and_version():
    import pejit

    text = _pejit_cli("--help")
    assert "``" not in text and ":func:" not in text
    assert "demo" in text and "python -m pejit.bench" in text
    assert _pejit_cli("--version").strip().startswith(f"pejit {pejit.__version__}")


def test_package_metadata():
    try:
        meta = importlib.metadata.metadata("pejit")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pejit is not installed (run from a source tree)")
    assert meta["Summary"].startswith("Partial-evaluation JIT compilation for JAX")
    assert (meta.get("License-Expression") or meta.get("License")) == "Apache-2.0"
    assert meta["Author"]
    assert meta.get_all("Project-URL")
    assert any(c.startswith("Topic :: ") for c in meta.get_all("Classifier"))
