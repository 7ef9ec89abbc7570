"""The words of the report, defined once: the html report's glossary (``id="glossary"``), the glossary section of
the markdown report (docs/RESULTS.md) and the links from each term's occurrences all read :data:`TERMS`.

A :class:`Term` has the name a reader sees, its definition (plain text), and the patterns its occurrences match in
the report's text (case-insensitive regular expressions; by default the name itself). ``anchor`` is the id of its
entry, so ``#g-fitted-constant`` links to "fitted constant".
"""
from __future__ import annotations

import dataclasses
import re

from ._words import check_text


@dataclasses.dataclass(frozen=True)
class Term:
    name: str
    definition: str
    matches: tuple[str, ...] = ()     # regexes of its occurrences in running text (default: the name)
    group: str = ""                   # the heading it is listed under
    values: tuple[str, ...] = ()      # verdict values that name it as a whole ("holds", "low"): chips and cells

    @property
    def anchor(self) -> str:
        return "g-" + re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")

    @property
    def patterns(self) -> tuple[str, ...]:
        return self.matches or (re.escape(self.name),)

    def short(self) -> str:
        """The definition's first sentence (a tooltip)."""
        return re.split(r"(?<=[a-z0-9)]\.)\s(?=[A-Z\"(])", self.definition, maxsplit=1)[0]


VERDICT, CONTROLS, CALLS, VARIANTS = ("Verdicts and constants", "The battery of controls", "Calls against a control",
                                      "Variants of the methods")

TERMS: tuple[Term, ...] = (
    # ------------------------------------------------------------------ verdicts and constants
    Term("holds", "The statement as written held in every trial, with the paper's own constants (a bound that is a "
         "number: a-priori, exact or a certificate). Whether that tells the method apart from doing nothing is the "
         "power's question; a statement that a trivial answer meets too is reported as vacuous instead.",
         (r"holds as stated", r"hold as stated", r"bound holds"), VERDICT, ("holds",)),
    Term("false as stated", "A counterexample to the statement as written, with the paper's constants: a trial whose "
         "measurement exceeds a bound that is a number. Its smallest input is named and can be rerun from its "
         "parameters and seed; a corrected statement is given where one is proven or measured. An O(.) statement "
         "read with constant 1 is never called false. A stated rate is false as stated when, past the size where it "
         "should set in (derived, and run to twice it or more), the exponent fitted per independent stream has a 95% "
         "interval that excludes the stated one by more than the growth tolerance; the measured exponent is given.", (r"false as stated",), VERDICT, ("false", "fails")),
    Term("proven constant", "A constant that the paper states or its proof gives, e.g. the walk's c = 30 log(n/δ). A "
         "bound with proven constants is a number, so a measurement above it is a counterexample.",
         (r"proven constants?",), VERDICT),
    Term("fitted constant", "The constant C that an O(.) statement leaves open, fitted to our measurements: "
         "C = the largest measured / shape over the sweep. It is not a bound (any finite data fit some C); the check "
         "asks instead whether measured / shape stays flat as the sizes grow (see rate). \"Holds with a fitted "
         "constant\" (holds-fitted) means the measurements follow the stated shape with that C. A tiny C (1e-14, "
         "1e-148) says the shape is astronomically larger than anything measured: the statement tells nothing at "
         "these sizes (see vacuous).",
         (r"holds[- ]fitted", r"holds? with (?:a )?fitted constant", r"fitted constants?", r"fitted C\b"), VERDICT),
    Term("shape", "The function inside an O(.) or Õ(.), every constant set to 1 (log(n/δ) in O(log(n/δ))). A shape "
         "has no number until a constant is fitted; a record whose bound is a shape is never a counterexample.",
         (r"O\(\.\) shapes?", r"\bshapes?\b"), VERDICT),
    Term("a-priori bound", "The paper's bound as a function of the parameters (n, d, ε, δ, the norms), fixed before "
         "any input is seen. Compare certificate.", (r"a-priori bounds?", r"a-priori scale"), VERDICT),
    Term("certificate", "A bound the algorithm computes from its own state after the fact (a posteriori), for the "
         "input it actually saw, e.g. the streaming press's live error bar. It is not the paper's a-priori bound: a "
         "certificate can be tight where the a-priori bound is vacuous, or vacuous itself; the report keeps the two "
         "apart and never uses one in place of the other.", (r"certificates?",), VERDICT),
    Term("vacuous", "A bound so loose that a trivial answer meets it too: on a real model's keys a decode theorem's "
         "scale can be e^60 or more, while returning zeros has an error of at most 1 in the same units. \"Holds\" "
         "would be true and say nothing, so the verdict reads \"vacuous at these norms\" and no fitted constant or "
         "rate of it is reported as a result. \"Vacuous at any norm\" where a term of the bound that no norm lowers "
         "already reaches the most doing nothing can err (SubGen's sqrt(d/s) = 1.79 at s = 20 value samples, d = 64): "
         "then zeros meets it on every input of those sizes.", (r"vacuous(?: at these norms| at any norm)?",), VERDICT),
    Term("not refuted", "A statement that sampling cannot refute (a lower bound, or a claim about every input of a "
         "space the check cannot enumerate): every trial agrees with it, and no finite sample could show it false.",
         (r"not[- ]refuted",), VERDICT, ("not-refuted",)),
    Term("inconclusive", "The records do not decide the statement: for an empirical claim, its reproduction is "
         "partial or underpowered (see reproduced, not shown); otherwise the check could not summarize them (the "
         "card says why).", (r"\binconclusive\b",), VERDICT, ("inconclusive",)),
    Term("erratum", "An error in a proof step or in the pseudocode that does not by itself refute the statement: the "
         "statement may still hold, but the step as written does not show it. Proof: sound when no step failed.",
         (r"errat(?:um|a)",), VERDICT, ("errata", "sound")),
    Term("rate observed / not reached", "A stated rate (O(1/t), O(log n), flat in n) is observed when measured / shape "
         "does not grow along the swept parameter in the range we ran (its log-log slope is not significantly "
         "positive). Not reached: where the size at which the rate should set in is derived (the walk's onset), that "
         "size lies beyond the largest one run, and both are said; elsewhere the ratio still grows at the largest "
         "sizes run. Neither is a counterexample: an O(.) speaks of large sizes only.",
         (r"rate not reached", r"regime not reached", r"not[- ]reached", r"rate observed"), VERDICT, ("observed", "not-reached")),
    Term("power", "Whether the check can tell right from wrong: shown when it rejects its negative controls "
         "(deliberately wrong inputs or bounds) and, for an error bound, the method does better than the battery "
         "of controls on the claim's own metric; low when a control passes or a trivial estimator does as well.",
         (r"low power", r"\bpower\b"), VERDICT, ("shown", "low")),
    Term("reproduced / partly reproduced", "An empirical claim (an experiment of the paper) rerun on our setup: "
         "reproduced when the paper's effect shows in every setting tested with enough instances to see it, partly "
         "when in some.", (r"partly reproduced", r"\breproduced\b", r"\bpartial\b"), VERDICT, ("reproduced", "partial")),
    Term("not shown (underpowered) vs not reproduced", "Not reproduced: the effect did not show and the test could "
         "have seen it (the interval excludes an effect of the paper's size): evidence against. Not shown "
         "(underpowered): it did not show, but too few instances (or an interval too wide) could not have seen it "
         "either: no evidence either way. Reversed: significantly the other way.",
         (r"not[- ]shown \(underpowered\)", r"not[- ]reproduced", r"underpowered", r"\breversed\b"), VERDICT, ("not-shown", "not-reproduced", "reversed")),
    Term("equal memory", "Every method and control holds the same number of floats per KV head (within 1%), weights, "
         "counts and working buffers included, so that a comparison says which uses its memory better.",
         (r"equal memory", r"at the method's memory"), VERDICT),
    # ------------------------------------------------------------------ the battery
    Term("the battery", "The controls every error-bound and decode claim is compared with at the method's own memory, "
         "on the same streams: doing nothing (zeros, the mean of the values), the field's standard baselines "
         "(StreamingLLM, a uniform sample) and the ablation. A method that does not beat them has shown nothing its "
         "layout or chance would not give.",
         (r"\bbattery\b", r"no better than doing nothing", r"trivial (?:estimators?|controls?)", r"doing nothing"), CONTROLS),
    Term("zeros", "The control that returns the zero vector: it holds nothing and its error is the exact answer's "
         "norm. A bound that zeros meets is vacuous.", (r"\bzeros\b",), CONTROLS),
    Term("mean of values", "The control that returns the running mean of the values (uniform attention weights, keys "
         "ignored; the mean of the keys for a logit claim): O(d) memory, no selection at all.",
         (r"mean of (?:the )?(?:values|keys)",), CONTROLS),
    Term("StreamingLLM", "The standard baseline of Xiao et al. 2023: the first 4 tokens (attention sinks) and the most "
         "recent ones at the method's memory, as kvpress's StreamingLLMPress. The recent window alone is the same "
         "without the sink.", (r"StreamingLLM", r"recent window"), CONTROLS),
    Term("uniform sample", "The standard baseline that keeps a uniformly random subset of the tokens at the method's "
         "memory (weighted so that its sums are unbiased; with the method's sink and window where it has them), "
         "then attends exactly over it.", (r"uniform(?: sample| sampling)", r"\buniform\b"), CONTROLS),
    Term("ablation", "The method with its core ingredient replaced by chance at the same memory: random signs for "
         "BalanceKV's walk, uniform sampling for SubGen's clusters and l2 samples, a Gaussian random projection of the "
         "data for Frequent Directions (a sketch of as many rows as FD's buffer) and the subspace method (bases from "
         "a random projection of its middle), a random basis of the same rank for the subspace claims, random "
         "halving for a streaming press. It asks whether the idea does anything beyond its layout and chance.",
         (r"ablations?", r"random signs"), CONTROLS),
    Term("exact attention", "The uncompressed cache: the reference every end-to-end score is compared with.",
         (r"exact attention",), CONTROLS),
    # ------------------------------------------------------------------ calls
    Term("better / leaning better / tied / leaning worse / worse", "The one rule for every call of a method "
         "against a baseline: a paired two-sided signed-rank test at the unit of replication, on the log-ratios "
         "method / baseline (on the differences for scores such as log-likelihood or accuracy), Holm over the "
         "claim's family of tests at 0.05, with the effect (Hodges-Lehmann) and its 95% interval. Better / worse: "
         "significant after Holm, the effect beyond the practical threshold (an error ratio of 1.05 either way, or a "
         "stated difference); leaning better / worse: significant before the correction (the interval excludes no "
         "effect) but not after; tied: neither, or an effect inside the threshold (\"tied with\" when the whole "
         "interval is inside it, \"not told apart from\" otherwise). Both directions are one rule.",
         (r"\bbetter\b", r"\btied\b", r"\bworse\b", r"\bleaning\b", r"not told apart"), CALLS,
         ("better", "leaning better", "tied", "leaning worse", "worse")),
    Term("unit of replication", "What a call counts as independent: a distinct text window (real keys), a "
         "distinct generation from a distinct prompt (decode), a distinct synthetic draw, a distinct task instance "
         "(end to end). Seeds of a randomized method are averaged (their median) within a unit, never counted as "
         "units; the layers and heads of one text are one unit.", (r"units? of replication", r"distinct texts?"),
         CALLS),
    Term("practitioner's metric", "The error a user of the cache sees: the mean relative attention error over "
         "held-out later queries attending to the compressed context (or a task's score). It decides every better / "
         "worse statement of the headlines, the per-paper answers and the practitioner's table. The theorem's metric "
         "(the worst checkpoint of the current query, in the theorem's units) decides the bound checks; each call "
         "names its metric.", (r"practitioner's metric", r"theorem's metric"), CALLS),
    Term("not attainable", "Too few units for any call: even every unit one way could not reach a Holm-adjusted "
         "p below 0.05 (the smallest attainable p, m 2^(1-n) for m tests and n units, is printed). Not evidence "
         "either way; more independent units are needed.", (r"not attainable",), CALLS, ("not attainable",)),
    Term("not tested", "No unit to compare: the baseline did not run, or the method holds at least the whole "
         "stream's floats, so that every baseline at equal memory would be exact.", (r"not tested",), CALLS,
         ("not-tested", "not tested")),
    # ------------------------------------------------------------------ variants
    Term("pseudocode walk", "BalanceKV as the papers' pseudocode states it, with the theorem's walk constant "
         "c = 30 log(n/δ). With that c every walk probability is 1/2 to ten digits on real keys: the walk is a fair "
         "coin, so the pseudocode variant is random halving (stratified uniform sampling). \"paper c\" names this "
         "constant, \"c = log\" the smaller log(n/δ).",
         (r"pseudocode walk", r"\bpseudocode\b", r"random halving", r"paper c\b", r"walk = coin"), VARIANTS),
    Term("greedy walk", "The same walk with a constant so small that every sign is chosen to lower the running "
         "discrepancy (probabilities clipped to 0 or 1): what discrepancy theory balances, without the theorem's "
         "guarantee.", (r"greedy walk", r"\bgreedy\b(?! k-center| decode)"), VARIANTS),
    Term("released walk", "BalanceKV as its authors released it (ksheth96/BalanceKV): a nearly greedy walk (93-100% of "
         "its probabilities clipped to 0 or 1) that centres the keys per block and weights the kept tokens; run at "
         "temperature 1 and 0.1, and with a consistent estimator.", (r"released(?: walk| code)?",), VARIANTS),
    Term("streaming press", "StreamingBalanceKVPress and StreamingSubGenPress: the methods inside generation, every "
         "layer held at a fixed size while tokens arrive. BalanceKV's press departs from the paper in four ways: "
         "pairs instead of free signs, a token budget instead of cells of a fixed size, one walk for numerator and "
         "denominator with no value-norm buckets, and per-row weights; at the theorem's c its walk is random halving "
         "too.", (r"streaming press(?:es)?", r"\(streaming(?:, in generation)?\)", r"streaming (?:BalanceKV|SubGen)"),
         VARIANTS),
)

BY_ANCHOR = {t.anchor: t for t in TERMS}
GROUPS = tuple(dict.fromkeys(t.group for t in TERMS))


def grouped() -> list[tuple[str, list[Term]]]:
    """(heading, terms) in the order of :data:`TERMS`."""
    return [(g, [t for t in TERMS if t.group == g]) for g in GROUPS]


def term_for(value: str) -> Term | None:
    """The term a verdict value or word names ("holds-fitted", "not-reached", "worse", "uniform sample"), or None."""
    text = check_text(value, "the value").strip()
    for t in TERMS:
        if text.lower() in t.values:
            return t
    for t in TERMS:
        if any(re.fullmatch(p, text, flags=re.IGNORECASE) for p in t.patterns):
            return t
    for t in TERMS:
        if any(re.search(p, text, flags=re.IGNORECASE) for p in t.patterns):
            return t
    return None


def markdown_section(heading: str = "## Glossary") -> list[str]:
    """The glossary as markdown lines: an anchor per term (``#g-...``, as in the html report)."""
    lines = ['<a id="glossary"></a>', heading, ""]
    for group, terms in grouped():
        lines += [f"**{group}**", ""]
        for t in terms:
            lines.append(f'- <a id="{t.anchor}"></a>**{t.name}**: {t.definition}')
        lines.append("")
    return lines
