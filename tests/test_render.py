"""What a person sees: pages rendered by a real browser (headless Chromium).

`explain(...)._repr_html_()` (what Jupyter shows) and a built page of the
documentation are loaded in headless Chromium with a probe script appended;
the probe measures the rendered page (layout boxes, computed colours) and
writes what it found into the DOM, which `--dump-dom` returns. Skipped,
saying so, when no Chromium is installed (Debian: `apt-get install -y
chromium`) or, for the docs page, when mkdocs is not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, explain

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome")) if p), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install -y chromium)"
)


def render(page: Path, probe: str, tmp_path: Path) -> dict:
    """Load ``page`` with the ``probe`` script appended; what the probe reported."""
    script = (
        "<script>(function(){const out = (" + probe + ")();"
        "const pre = document.createElement('pre'); pre.id = 'pejit-probe';"
        "pre.textContent = JSON.stringify(out); document.body.appendChild(pre);})();</script>"
    )
    text = page.read_text(encoding="utf-8")
    probed = page.with_name("_probe_" + page.name)
    probed.write_text(text.replace("</body>", script + "</body>") if "</body>" in text else text + script,
                      encoding="utf-8")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,1000",
         "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    m = re.search(r'<pre id="pejit-probe">(.*?)</pre>', proc.stdout, re.DOTALL)
    assert m, f"the probe did not run:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


_REPORT_PROBE = """function () {
  const visible = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  return {
    summary: document.querySelector('div > pre').innerText,
    panels: [...document.querySelectorAll('td')].map((td) => {
      const r = td.getBoundingClientRect();
      const spans = [...td.querySelectorAll('pre span')];
      return {
        title: td.querySelector('b').innerText, left: r.left, top: r.top, visible: visible(td),
        lines: spans.map((s) => s.innerText),
        green: spans.filter((s) => getComputedStyle(s).backgroundColor === 'rgb(230, 244, 234)')
                    .map((s) => s.innerText),
      };
    }),
  };
}"""


def inv_chol(A, x):
    return jnp.linalg.inv(A) @ x + jnp.linalg.cholesky(A @ A.T) @ x


def test_explain_html_shows_both_jaxprs_with_folded_lines_marked(tmp_path):
    A = jnp.asarray(3 * np.eye(6), jnp.float32)
    # affine=False keeps the two products (the residual algebra collapses them into one)
    report = explain(inv_chol, A, jnp.ones(6), constant_argnums=0, fold_options=FoldOptions(affine=False))
    page = tmp_path / "report.html"
    page.write_text(f"<html><body>{report._repr_html_()}</body></html>", encoding="utf-8")
    seen = render(page, _REPORT_PROBE, tmp_path)

    before, after = seen["panels"]
    assert before["title"].startswith("before") and after["title"].startswith("after")
    assert before["visible"] and after["visible"]
    assert before["left"] < after["left"] and abs(before["top"] - after["top"]) < 5  # side by side
    # Every equation is a visible line; the folded ones, and only they, are green.
    assert len(before["lines"]) == len(report.before.jaxpr.eqns)
    assert len(after["lines"]) == len(report.after.jaxpr.eqns)
    assert len(before["green"]) == report.marks.count("folded") > 0
    assert all(line.endswith("# folded") for line in before["green"])
    assert after["green"] == []
    assert sum("dot_general" in line for line in after["lines"]) == 2
    assert "estimated FLOPs per call" in seen["summary"]


_DOCS_PROBE = """function () {
  const visible = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const note = document.querySelector('.admonition.note');
  return {
    h1: [...document.querySelectorAll('article h1, .md-content h1')].filter(visible).map((h) => h.innerText),
    h2: [...document.querySelectorAll('.md-content h2')].map((h) => h.id),
    toc: [...document.querySelectorAll('nav.md-nav--secondary a.md-nav__link')].filter(visible)
           .map((a) => a.getAttribute('href')),
    note: note && visible(note) ? note.innerText : null,
    noteHeadings: note ? note.querySelectorAll('h1, h2, h3').length : -1,
    highlighted: [...document.querySelectorAll('.md-content pre code')].filter(visible)
                   .map((c) => c.querySelectorAll('span').length),
  };
}"""


def test_getting_started_page_renders_its_note_and_table_of_contents(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip('mkdocs is not installed: install the docs extra (pip install -e ".[docs]")')
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "-d", str(site)], cwd=ROOT, check=True,
        capture_output=True, timeout=300, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    seen = render(site / "getting-started" / "index.html", _DOCS_PROBE, tmp_path)

    assert [h.rstrip("¶") for h in seen["h1"]] == ["Getting started"]
    assert seen["h2"] and all(f"#{h}" in seen["toc"] for h in seen["h2"]), seen
    assert seen["note"] is not None and "#39103" in seen["note"] and "XLA_FLAGS" in seen["note"]
    assert seen["noteHeadings"] == 0
    assert seen["highlighted"] and all(n > 0 for n in seen["highlighted"])  # code is highlighted
