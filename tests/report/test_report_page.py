"""The report as a reader meets it: the glossary and the links to it, the statement chips' colours, the html
finishing pass (tables in scrolling boxes), counterexamples in words."""
from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser

import pytest

from kvbounds.report import _glossary as glossary
from kvbounds.report import _report as report
from kvbounds.report._html import SCROLLS, finish
from kvbounds.verdict._rules import Verdict, finalize

# the words issue's reader stumbled on, each defined (the glossary's promise)
REQUIRED = ["fitted constant", "proven constant", "shape", "rate observed / not reached", "power", "the battery",
            "zeros", "mean of values", "StreamingLLM", "uniform sample", "ablation",
            "better / leaning better / tied / leaning worse / worse", "not attainable",
            "not shown (underpowered) vs not reproduced", "vacuous", "certificate", "pseudocode walk", "greedy walk",
            "released walk", "streaming press"]


def test_the_glossary_defines_every_required_term_once():
    names = [t.name for t in glossary.TERMS]
    assert len(names) == len(set(names)) and len({t.anchor for t in glossary.TERMS}) == len(names)
    assert set(REQUIRED) <= set(names), set(REQUIRED) - set(names)
    for t in glossary.TERMS:
        assert 60 <= len(t.definition) <= 800 and t.definition[0].isupper() and t.definition.endswith("."), t.name
        assert t.short() and len(t.short()) <= len(t.definition)
    certificate = next(t for t in glossary.TERMS if t.name == "certificate").definition
    assert "a posteriori" in certificate and "a-priori" in certificate        # the two kinds of bound kept apart
    walk = next(t for t in glossary.TERMS if t.name == "pseudocode walk").definition
    assert "random halving" in walk and "c = 30 log(n/δ)" in walk


@pytest.mark.parametrize("value, name", [("holds-fitted", "fitted constant"), ("not-reached", "rate observed / not reached"),
                                         ("worse", "better / leaning better / tied / leaning worse / worse"), ("low", "power"), ("errata", "erratum"),
                                         ("vacuous at these norms (scale e^61)", "vacuous"),
                                         ("not-shown", "not shown (underpowered) vs not reproduced"),
                                         ("recent window", "StreamingLLM"), ("holds", "holds")])
def test_a_verdict_value_finds_its_term(value, name):
    assert glossary.term_for(value).name == name
    assert report.define(value) == glossary.term_for(value).short()


def test_the_markdown_glossary_has_an_anchor_per_term():
    text = "\n".join(glossary.markdown_section())
    assert '<a id="glossary"></a>' in text
    for t in glossary.TERMS:
        assert f'<a id="{t.anchor}"></a>**{t.name}**' in text


class _Tags(HTMLParser):
    """Checks that the page's tags nest (every end tag closes the innermost open element) and collects links."""
    VOID = {"meta", "img", "br", "hr", "link", "input", "source", "col", "wbr"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.links, self.ids, self.boxes = [], [], [], set(), []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and (a.get("class") == "gloss"):
            self.links.append((a["href"], [t for t, _ in self.stack]))
        if tag == "div" and a.get("class") == "scroll":
            self.boxes.append(a.get("aria-label", ""))
        if tag not in self.VOID:
            self.stack.append((tag, a))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1][0] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1][0] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A report of hand-made verdicts: a hold, a false statement with a counterexample, a vacuous one."""
    from kvbounds import claims as registry
    ids = list(registry.CLAIMS)[:3]
    v0 = finalize(Verdict(ids[0], "holds", "10/10 trials within bound; zeros and the recent window also meet it",
                          statement="holds", power="low", power_note="no better than zeros (synthetic benign)"))
    v1 = finalize(Verdict(ids[1], "fails", "a trial above the bound", statement="false",
                          counterexample={"params": {"n": 2, "rule": "proof001", "eps": 0.5, "sweep": "n"}, "seed": 0,
                                          "backend": "numpy", "measured": 1.5, "bound": 1.0, "ratio": 1.5,
                                          "bound_kind": "a-priori", "check": "main"}))
    v2 = finalize(Verdict(ids[2], "holds (fitted constant)", "fitted constant C = 1e-148", statement="holds-fitted"))
    v2.statement = "vacuous"
    html = report.render_html({ids[0]: v0, ids[1]: v1, ids[2]: v2}, [], {}, meta=dict(
        version="0", commit="x", profile="smoke", records=0, generated="now", seeds="0", backends="numpy", claims=3,
        duration="", trial_time="", orphans=""), glossary_links=True)
    return html, ids


def test_every_term_linked_once_per_section_and_the_html_nests(page):
    html, _ = page
    tags = _Tags()
    tags.feed(html)
    assert not tags.errors, tags.errors[:5]
    assert tags.links, "no glossary link"
    for href, ancestors in tags.links:
        assert href[1:] in tags.ids, f"a link to {href}, which the page does not define"
        assert not {"a", "code", "pre", "h1", "h2", "h3", "summary", "nav"} & set(ancestors), (href, ancestors)
    assert 'id="glossary"' in html and html.index('id="glossary"') > html.index('id="claims"')
    for t in glossary.TERMS:
        assert f'id="{t.anchor}"' in html
    # per card: a term is linked at most once
    for card in re.findall(r'<section class="card.*?</section>', html, re.S):
        hrefs = re.findall(r'class="gloss" href="([^"]+)"', card)
        assert len(hrefs) == len(set(hrefs)), hrefs
    assert 'href="#g-zeros"' in html and 'href="#g-power"' in html


def test_every_table_scrolls_in_a_box_that_says_so(page):
    html, _ = page
    tags = _Tags()
    tags.feed(html)
    assert html.count("<table") == len(tags.boxes) and all(SCROLLS in b for b in tags.boxes)
    assert finish(html, ()) == html          # finishing twice wraps nothing twice


def test_statement_chips_green_only_where_it_holds_not_vacuous_not_worse():
    def chip(**kw):
        return report.statement_tone(finalize(Verdict("X", "holds", "s", **kw)))
    assert chip(statement="holds") == "good"
    assert chip(statement="holds-fitted") == "good"
    assert chip(statement="holds", power="low") == "good"              # not better is not worse
    assert chip(statement="false", counterexample={"params": {"n": 2}}) == "bad"
    v = finalize(Verdict("X", "holds", "s", statement="holds-fitted"))
    for statement in ("vacuous", "vacuous at these norms", "not-refuted", "inconclusive"):
        assert report.statement_tone(dataclasses.replace(v, statement=statement)) != "good", statement
    worse_power = dataclasses.replace(v, power="worse")
    worse_call = dataclasses.replace(v, power_table=[{"setting": "real", "calls": [{"control": "streaming_llm",
                                                                                    "call": "worse"}]}])
    tied_call = dataclasses.replace(v, power_table=[{"setting": "real", "call": "tied"}])
    assert report.statement_tone(worse_power) == "warn" and report.statement_tone(worse_call) == "warn"
    assert report.statement_tone(tied_call) == "good"
    assert report.card_tone(dataclasses.replace(worse_call, headline="holds with fitted constant C = 2")) == "warn"


def test_a_vacuous_statement_chip_is_not_green_on_the_page(page):
    html, ids = page
    anchor = "claim-" + re.sub(r"[^A-Za-z0-9_-]", "_", ids[2])
    card = html.split(f'id="{anchor}"', 1)[1].split("</section>", 1)[0]
    card = re.sub(r'<a class="gloss"[^>]*>(.*?)</a>', r"\1", card)
    chips = re.findall(r'<span class="chip (\w+)"[^>]*>statement: ([^<]*)', card)
    assert chips == [("warn", "vacuous")], chips


def test_a_counterexample_reads_in_words_not_json():
    from kvbounds.report._words import counterexample_in_words, params_in_words
    cx = {"params": {"M": 4, "d": 2, "ell": 3, "kind": "diag", "n": 2, "r": 1, "sweep": "minimal"}, "seed": 0,
          "backend": "numpy", "measured": 1.0, "bound": 0.9737734518532143, "ratio": 1.026932905283948,
          "bound_kind": "a-priori", "check": "draft (DK eta)", "violations": 11, "decisive_trials": 139}
    text = counterexample_in_words(cx)
    assert text.startswith("n = 2, d = 2, r = 1, M = 4, ℓ = 3, kind = diag (seed 0, numpy): measured 1 against "
                           "the bound 0.9738 (a-priori; ratio 1.027)"), text
    assert "11 of 139 decisive trials" in text and "{" not in text and "sweep" not in text
    assert "not a finite number" not in text
    assert "no finite number" in counterexample_in_words(dict(cx, measured="inf", ratio="inf"))
    assert params_in_words({"d": 8, "eps": 0.5, "n": 1024, "r": 1.0, "rule": "proof001"}) == \
        "n = 1024, d = 8, r = 1, ε = 0.5, erase rule = the proof's threshold (BalanceKV-NeurIPS A.1)"
    assert params_in_words({"J": 2, "sizes": [1, 1]}) == "J = 2, sizes = (1, 1)"


def test_an_infinite_ratio_says_why():
    from kvbounds.report._words import infinite_ratios
    table = [{"setting": "real MiniLM", "ratio": float("inf"), "ratio_ci": (0.51, float("inf")),
              "controls": {"zeros": 1.0, "recent": 8e-16}}, {"setting": "synthetic", "ratio": 0.5, "ratio_ci": (0.4, 0.6),
                                                               "controls": {"zeros": 1.0}}]
    (line,) = infinite_ratios(table, {"recent": "recent window"})
    assert line.startswith("real MiniLM: ∞ because the error of recent window is 0") and "does not compress" in line
    table[0]["controls"]["uniform"] = 0.0
    assert infinite_ratios(table[:1])[0].startswith("real MiniLM: ∞ because the errors of recent and uniform are 0")


# ------------------------------------------------------------------------------------------ figures
def _draw(tmp_path, spec, recs, const=None):
    from kvbounds.report import _figures as report_figures
    labels: dict = {}
    note, caption = report_figures.draw_figure(spec, recs, tmp_path / "f.png", const, None, labels)
    assert note is None and (tmp_path / "f.png").stat().st_size > 1000
    return labels, caption


def test_a_figure_draws_a_numeric_bound_at_the_claimed_value(tmp_path):
    """SubGen's failure rate is claimed <= 0.01 at sample sizes with fitted constants (bound kind "fitted"): the
    line is at 0.01, not at the fitted constant times it (0.0425 was drawn)."""
    from kvbounds.core import Record
    from kvbounds.verdict._rules import FigureSpec
    recs = [Record("X", {"lam": lam}, 0, "numpy", rate, 0.01, rate <= 0.01, bound_kind="fitted", check="lambda sweep")
            for lam, rate in ((0.125, 0.0425), (0.5, 0.005), (2.0, 0.0))]
    labels, _ = _draw(tmp_path, FigureSpec("failure rate vs lambda (claimed <= 0.01)", x="lam", logy=False), recs)
    assert labels["bound"] == [0.01] and labels["legend"] == ["bound as stated (constants fitted)"]


def test_a_shape_is_drawn_as_a_scaled_shape_not_as_a_bound(tmp_path):
    from kvbounds.core import Record
    from kvbounds.verdict._rules import FigureSpec
    recs = [Record("X", {"n": n}, 0, "numpy", 2.0 * n, float(n), True, bound_kind="shape", check="c") for n in (8, 16)]
    labels, _ = _draw(tmp_path, FigureSpec("floats held vs n", x="n"), recs, 2.0)
    assert labels["bound"] == [16.0, 32.0]
    assert labels["legend"] == ["O(.) shape × fitted C = 2 (no constant stated: not a bound)"]


def test_a_bound_off_the_chart_is_said_not_drawn(tmp_path):
    """The decode theorems' scale (e^61 and more; a fitted constant of 1e-14) is not drawn; the legend says what it
    is and that returning zeros meets it."""
    from kvbounds.core import Record
    from kvbounds.verdict._rules import FigureSpec
    recs = [Record("X", {"n": n, "layer": 0, "sweep": "n"}, 0, "numpy", 0.02, float("inf"), True, bound_kind="shape",
                   check="decode", extra={"log_scale": ls, "controls_eps": {"zeros": 0.6}})
            for n, ls in ((160, 900.0), (192, 61.0))]
    spec = FigureSpec("eps_hat vs n (bound: the theorem's scale)", x="n", hue="layer", show_bound=False, sweep="n")
    labels, caption = _draw(tmp_path, spec, recs)
    assert labels["bound"] == []
    (note,) = [t for t in labels["legend"] if t.startswith("bound not drawn")]
    note = " ".join(note.split())
    assert "e^480 here (e^61..e^900), off the chart" in note and "vacuous at these norms" in note, note
    assert caption.startswith("bound not drawn: the O(.)'s scale (constant 1) is e^480")
    near = [Record("X", {"n": n}, 0, "numpy", 0.5, 1.0, True, bound_kind="a-priori") for n in (8, 16)]
    labels, caption = _draw(tmp_path, FigureSpec("x vs n", x="n"), near)
    assert labels["bound"] == [1.0] and "not drawn" not in caption


def test_the_leaderboard_figure_draws_one_panel_per_task():
    from kvbounds.report._leaderboard import board_panels
    pts = {m: {"uniform": [(0.25, 1e6, 1.0, 0.9, 1.1)]} for m in (
        "ppl: perplexity", "ppl: NLL increase vs exact (nats/token)", "passkey: exact match",
        "passkey: answer log-likelihood (nats)", "passkey, question inside: answer log-likelihood (nats)",
        "lines, question inside: answer log-likelihood (nats)", "decode: attention error / (a), SmolLM2 generating",
        "decode: attention error / (b), SmolLM2 generating")}
    assert board_panels(pts) == ["ppl: perplexity", "passkey: answer log-likelihood (nats)",
                                 "lines, question inside: answer log-likelihood (nats)",
                                 "decode: attention error / (a), SmolLM2 generating",
                                 "decode: attention error / (b), SmolLM2 generating"]


def test_terms_link_whole_words_only_and_never_inside_code_or_links():
    html = finish('<section><p>balancekv_released, StreamingLLMPress, <code>zeros</code>, <a href="#x">zeros</a>, '
                  'the released walk and zeros, then zeros again</p></section>')
    assert html.count('class="gloss"') == 2
    assert '<a class="gloss" href="#g-released-walk"' in html and html.count('href="#g-zeros"') == 1
    assert "balancekv_released" in html and "<code>zeros</code>" in html and '<a href="#x">zeros</a>' in html


def test_a_verdict_in_words_follows_its_dimensions():
    from kvbounds.report._words import verdict_in_words, what_the_records_show
    from kvbounds.verdict._rules import Constant, Erratum
    v = finalize(Verdict("X", "holds", "s", statement="holds-fitted", rate="not-reached", power="low",
                         power_note="no better than zeros (real SmolLM2)",
                         fitted_constant=Constant(2.3e-14, "fitted", "max"), errata=[Erratum("step 2", "sign")]))
    text = verdict_in_words(v)
    assert text.startswith("Every measurement is within the stated O(.) shape times a fitted constant C = 2.3e-14")
    assert "tells nothing at these sizes" in text and "rate not reached: not a counterexample" in text
    assert "1 erratum" in text and "no better than zeros (real SmolLM2)" in text and text.endswith(".")
    assert "vacuous at these norms" in verdict_in_words(dataclasses.replace(v, statement="vacuous"))
    from kvbounds import claims as registry
    cid = next(iter(registry.CLAIMS))
    assert what_the_records_show({cid: v}, [cid, "missing"]).startswith(f"- **{cid}** (")
