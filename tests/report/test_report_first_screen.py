"""The report's first screen and length (issue: answers a reader can read): rendered from the committed
docs/summary.json and measured in a headless Chromium at 1280 x 800, the per-paper answers and the decision lie in
the first screen, and the page, claim cards folded, is under 25 screens. Slow (a browser start on a loaded machine
takes seconds); skipped without Chromium unless KVBOUNDS_REQUIRE_BROWSER=1."""
from __future__ import annotations

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
from kvbounds.report.summary_read import load_summary, verdicts_from_summary

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
WIDTH, HEIGHT, MAX_SCREENS = 1280, 800, 25
PROBE = """<script>
var a = document.getElementById('answers'), d = document.getElementById('decision');
var folded = Array.prototype.every.call(document.querySelectorAll('details.card-fold'), function (x) { return !x.open; });
var pre = document.createElement('pre'); pre.id = 'kvb-probe';
pre.textContent = JSON.stringify({height: document.documentElement.scrollHeight, folded: folded,
  cards: document.querySelectorAll('details.card-fold').length,
  answers_top: a.getBoundingClientRect().top, decision_bottom: d.getBoundingClientRect().bottom});
document.body.appendChild(pre);
</script></body>"""


def _page(tmp_path: Path) -> Path:
    summary = load_summary(ROOT / "docs" / "summary.json")
    text = report.render_html(verdicts_from_summary(summary), [], {}, meta=dict(summary["run"], generated="",
                              orphans=""), board=summary.get("leaderboard"), practitioner=summary.get("practitioner"),
                              glossary_links=True)
    page = tmp_path / "report.html"
    page.write_text(text.replace("</body>", PROBE, 1), encoding="utf-8")
    return page


def test_answers_and_decision_fill_the_first_screen_and_the_page_is_short(tmp_path):
    if BROWSER is None:
        if os.environ.get("KVBOUNDS_REQUIRE_BROWSER"):
            pytest.fail("KVBOUNDS_REQUIRE_BROWSER is set but no chromium is installed")
        pytest.skip("no headless browser (apt-get install chromium)")
    page = _page(tmp_path)
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "--dump-dom",
                              page.as_uri()], capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="kvb-probe">(.*?)</pre>', res.stdout, re.S)
    assert m, res.stderr[-1500:]
    got = json.loads(html.unescape(m.group(1)))
    assert got["folded"] and got["cards"] == len(verdicts_from_summary(load_summary(ROOT / "docs" / "summary.json")))
    assert got["answers_top"] < HEIGHT and got["decision_bottom"] <= HEIGHT, got
    assert got["height"] / HEIGHT < MAX_SCREENS, got
