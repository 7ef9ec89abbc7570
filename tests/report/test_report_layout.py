"""The report fits the screen: measured in a headless Chromium at 1280 and 800 px wide, the page does not scroll
sideways (``document.documentElement.scrollWidth <= window.innerWidth``) and no element reaches past the viewport
unless it sits in a scrolling box that says so (a ``div.scroll`` whose label says it scrolls sideways: wide tables
scroll inside their own box). Every ``<details>`` is opened first, so what a reader unfolds is measured too.

The page is one report of the session's smoke records of a few claims (a counterexample, power tables with an
infinite ratio, the end-to-end leaderboard, a decode figure), with the first table made wider than any screen (a
dozen extra settings with long names), so that the test holds whatever that table shows. The browser is driven
with ``--dump-dom`` and a script appended to a copy of the page: no driver to install besides Chromium itself.
Without Chromium the test is skipped with the reason, unless ``KVBOUNDS_REQUIRE_BROWSER=1`` (CI's .ci/run installs
Chromium and sets it), where it fails.
"""
from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from kvbounds.report import _report as report
from kvbounds.report._html import SCROLLS

CLAIMS = ["FD.residual", "SG.attention", "BKV.e2e", "BKV.decode"]
WIDTHS = (1280, 800)
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)

MEASURE = """
document.querySelectorAll('details').forEach(function (d) { d.open = true; });
(function () {
  var W = window.innerWidth, out = {width: W, scrollWidth: document.documentElement.scrollWidth, outside: []};
  function boxed(el) {           // inside a box that scrolls sideways and says so
    for (var a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      var s = getComputedStyle(a);
      if ((s.overflowX === 'auto' || s.overflowX === 'scroll') && (a.getAttribute('aria-label') || '').indexOf(%s) >= 0)
        return true;
    }
    return false;
  }
  document.body.querySelectorAll('*').forEach(function (el) {
    var r = el.getBoundingClientRect();
    if ((r.width || r.height) && (r.right > W + 0.5 || r.left < -0.5) && !boxed(el) && !el.closest('[data-outside]')) {
      el.dataset.outside = '1';                 // its descendants are not listed again
      out.outside.push(el.tagName.toLowerCase() + (el.className ? '.' + el.className : '') + ' [' +
                       Math.round(r.left) + ', ' + Math.round(r.right) + '] ' + (el.textContent || '').slice(0, 80));
    }
  });
  var pre = document.createElement('pre'); pre.id = 'kvb-measure'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
""" % json.dumps(SCROLLS)


def measure(page: Path, width: int) -> dict:
    """Open ``page`` (a copy with the measuring script, beside it so its figures load) at ``width`` px."""
    probe = page.with_name(f"measure-{width}.html")
    probe.write_text(page.read_text().replace("</body>", f"<script>{MEASURE}</script></body>"))
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              "--disable-background-networking", "--disable-component-update", "--disable-sync",
                              f"--user-data-dir={profile}", f"--window-size={width},900", "--dump-dom",
                              probe.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="kvb-measure">(.*?)</pre>', res.stdout, re.S)
    assert m, f"no measurement from {BROWSER} (exit {res.returncode}): {res.stderr[-1500:]}"
    return json.loads(html.unescape(m.group(1)))


@pytest.fixture
def page(tmp_path_factory, smoke_store) -> Path:
    if BROWSER is None:
        if os.environ.get("KVBOUNDS_REQUIRE_BROWSER"):
            pytest.fail("KVBOUNDS_REQUIRE_BROWSER is set but no chromium is installed")
        pytest.skip("no headless browser: the page-layout test needs Chromium (apt-get install chromium)")
    out = tmp_path_factory.mktemp("layout") / "results"
    smoke_store.copy_into(out, CLAIMS)
    build = report.build_verdicts

    def wide_first_table(records, claims=None):
        """The verdicts, the first table given twelve more stream families with long names (each with the calls
        of the claim's first family)."""
        verdicts = build(records, claims)
        for cid, v in verdicts.items():
            if v.power_calls:
                extra = [dict(c, family=f"a stream family with a long name, number {i}")
                         for i in range(12) for c in v.power_calls[:5]]
                verdicts[cid] = dataclasses.replace(v, power_calls=list(v.power_calls) + extra)
                break
        return verdicts

    mp = pytest.MonkeyPatch()
    mp.setattr(report, "build_verdicts", wide_first_table)
    try:
        return report.write_report(out)
    finally:
        mp.undo()


def test_the_report_fits_the_screen(page):
    """One test for both widths, so that the page is built once (an xdist worker would build it again)."""
    text = page.read_text()
    assert "a stream family with a long name, number 11" in text        # the stress above reached the first table
    assert text.count("<table") == text.count(f"{SCROLLS} when wider than the page")
    for width in WIDTHS:
        m = measure(page, width)
        assert m["width"] == width, m
        assert m["scrollWidth"] <= m["width"], f"the page scrolls sideways at {width} px: {m['scrollWidth']} px " \
                                               f"wide; outside the viewport: {m['outside'][:8]}"
        assert not m["outside"], f"at {width} px, elements past the viewport outside a scrolling box: " \
                                 f"{m['outside'][:8]}"
