"""Why BalanceKV's walk does or does not balance, in the BalanceKV checks' records and verdicts (BKV.attention,
BKV.vs-uniform, BKV.ablation, BKV.decode, BKV.e2e).

Each check stores one field per record, ``extra["walk_cause"]``: ``{"raw": summary, "centred": summary}`` where a
summary is :func:`kvbounds.algorithms.walk_diagnostics.summarize_diagnostics`'s ``{number: {median, min, max, mean},
"blocks": N}`` over the blocks (or pair groups) the walk saw, without and with the released code's key centring
(each block's keys minus their mean; :mod:`kvbounds.battery.walk_probe` records the walks of a running stream,
:func:`kvbounds.algorithms.walk_diagnostics.blockwise_walk_cause` measures the first-level blocks of blockwise
BalanceKV). Blockwise checks store one such pair per kernel (``{"balance": ..., "released-t0.1": ...}``) and each
variant's record its own kernel's.

Two measures of balancing, each a ratio to independent random signs' expectation (1 for both, whatever the data):

* the query side (where measured: the blockwise checks, whose held-out queries are the last ``window`` queries):
  ||sum_i eta_i e^{<k_i, q>/sqrt d} v_i||^2 over its random-sign expectation, averaged over the held-out queries, and
  the same without v (the denominator) (:mod:`kvbounds.algorithms.query_discrepancy`; the mean over blocks). This is
  what the attention error of the kept half is made of;
* the Gram yardstick eta^T G eta / tr G on the kernel the walk balances (the median block). Its diagonal holds the
  self-similarities e^{temp ||k_i||^2 / sqrt d}, which no real query reaches: on real keys it reads 1.00 where the
  queries see a walk balance.

The verdict states the cause per setting (a stream family, a layer, a model) in the query side's terms where it is
measured, in this order: the walk at the theorem's c is a coin where at least ``COIN`` of its signs equal random
signs' (what the queries see is then random signs' discrepancy; what greedy would reach beside it); else the walk
balances what the queries see where its numerator ratio is below ``BALANCES``; else it does not (and whether greedy
could). Without query-side numbers the sentence reads the Gram yardstick and says that it is the yardstick.
"""
from __future__ import annotations

import numpy as np

from kvbounds.verdict import Finding
from kvbounds.algorithms import walk_diagnostics as wd

__all__ = ["BALANCES", "NOTHING_TO_BALANCE", "COIN", "NUMBERS", "CENTRING", "THRESHOLDS", "VARIANT_KERNELS", "CACHED",
           "blockwise_cause", "merge", "merge_sides", "query_side", "sentence", "cause_text", "per_setting",
           "settings_text", "cause_finding", "blockwise_text"]

# the query side: a walk's numerator keeps below 90% of random signs' discrepancy as held-out queries see it (mean
# over blocks; random signs' expectation is exactly 1, one draw of them over SmolLM2's blocks reads about 0.8-1.1)
BALANCES = 0.9
# the Gram yardstick (where no query side is measured): greedy keeps >= 90% of random signs' eta^T G eta in the
# median block (measured 0.97-1 on SmolLM2 past layer 0, 0.14-0.86 where the kernel has off-diagonal mass)
NOTHING_TO_BALANCE = 0.9
COIN = 0.95           # >= 95% of the walk's signs equal the random rule's: its probabilities moved (almost) no sign
NUMBERS = ("offdiag_share", "theorem_equal_random", "theorem_disc_ratio", "released_equal_random",
           "released_disc_ratio", "greedy_disc_ratio", "random_disc_ratio", "key_energy", "key_distance",
           *(f"{rule}_query_{side}" for rule in ("theorem", "released", "greedy", "random") for side in ("num", "den")))
CENTRING = "with the released code's key centring"
THRESHOLDS = (f"Every ratio is to independent random signs' expectation (1). Thresholds: 'balances' where the walk's "
              f"numerator keeps below {BALANCES:g} of it as held-out queries see it (mean over blocks); 'a coin' where "
              f">= {100 * COIN:.0f}% of the walk's signs equal random signs'; 'the Gram yardstick sees nothing to "
              f"balance' (no queries measured) where greedy keeps >= {NOTHING_TO_BALANCE:g} of eta^T G eta in the "
              "median block")
# the kernel whose walk each blockwise variant runs (walk_diagnostics.KERNELS) and the walk's rule
VARIANT_KERNELS = {"balance": ("balance", "theorem"), "balance-unweighted": ("balance", "theorem"),
                   "released-t1": ("released-t1", "released"), "released-t0.1": ("released-t0.1", "released"),
                   "consistent-t0.1": ("released-t0.1", "released")}
_BLOCKWISE: dict = {}
CACHED = 16          # layouts kept per process (a few hundred numbers each): the trials of one layer share them


def blockwise_cause(trace: str, K, V, *, block_size: int, sink: int, window: int, kernels, Q=None) -> dict:
    """:func:`kvbounds.algorithms.walk_diagnostics.blockwise_walk_cause` on the first-level blocks of one layer's
    KV heads (``Q``: each KV head's held-out queries, (kv heads, m, d), or None), its uniforms seeded from the trace's
    name and the layout (the same numbers for every trial of a layer, whatever its seed or T; computed once per
    process and layout: the last ``CACHED`` layouts are kept)."""
    import zlib
    key = (trace, int(block_size), int(sink), int(window), tuple(kernels), Q is not None)
    if key not in _BLOCKWISE:
        rng = np.random.default_rng([7, zlib.crc32(repr(key[:5]).encode())])
        while len(_BLOCKWISE) >= CACHED:
            _BLOCKWISE.pop(next(iter(_BLOCKWISE)))
        _BLOCKWISE[key] = wd.blockwise_walk_cause(K, V, block_size=block_size, sink=sink, window=window,
                                                  kernels=tuple(kernels), rng=rng, Q=Q)
    return _BLOCKWISE[key]


def merge(summaries) -> dict | None:
    """One summary from several (streams, layers, trials of one setting): per number the median of the medians, the
    smallest minimum, the largest maximum and the block-weighted mean of the means; ``blocks`` summed. None when none
    is given."""
    summaries = [s for s in summaries if isinstance(s, dict) and s.get("blocks")]
    if not summaries:
        return None
    out = {"blocks": int(sum(s["blocks"] for s in summaries))}
    for k in NUMBERS:
        vals = [s[k] for s in summaries if isinstance(s.get(k), dict)]
        if len(vals) == len(summaries):
            out[k] = dict(median=float(np.median([v["median"] for v in vals])),
                          min=float(min(v["min"] for v in vals)), max=float(max(v["max"] for v in vals)))
            if all("mean" in v for v in vals):
                w = [s["blocks"] for s in summaries]
                out[k]["mean"] = float(np.average([v["mean"] for v in vals], weights=w))
    return out


def merge_sides(causes) -> dict | None:
    """{"raw": merged, "centred": merged} from several ``{"raw": ..., "centred": ...}``; None without any."""
    causes = [c for c in causes if isinstance(c, dict) and "raw" in c]
    if not causes:
        return None
    return {side: merge([c.get(side) for c in causes]) for side in ("raw", "centred")}


def _med(s: dict, k: str) -> float | None:
    return s[k]["median"] if isinstance(s.get(k), dict) else None


def _mean(s: dict, k: str) -> float | None:
    return s[k].get("mean") if isinstance(s.get(k), dict) else None


def query_side(s: dict | None, walk: str = "theorem") -> dict | None:
    """The query-side numbers of one side of a setting (means over blocks): ``num`` / ``den`` (the walk's numerator
    and denominator), ``greedy_num`` / ``greedy_den`` and ``random_num`` (one draw of random signs), with the Gram
    yardstick beside them (``gram``, ``greedy_gram``: medians) and the share of the walk's signs equal to random
    signs' (``same``); None where the query side was not measured."""
    if not s or _mean(s, f"{walk}_query_num") is None or _mean(s, "greedy_query_num") is None:
        return None
    return dict(num=_mean(s, f"{walk}_query_num"), den=_mean(s, f"{walk}_query_den"),
                greedy_num=_mean(s, "greedy_query_num"), greedy_den=_mean(s, "greedy_query_den"),
                random_num=_mean(s, "random_query_num"), gram=_med(s, f"{walk}_disc_ratio"),
                greedy_gram=_med(s, "greedy_disc_ratio"), same=_med(s, f"{walk}_equal_random"))


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _query_sentence(q: dict, walk: str) -> str:
    who = "the released walk" if walk == "released" else "the walk"
    gram = f"the Gram yardstick reads {_f(q['gram'])} (greedy's {_f(q['greedy_gram'])})"
    if walk == "theorem" and q["same"] is not None and q["same"] >= COIN:
        return (f"the theorem's c makes the walk a coin ({100 * q['same']:.0f}% of signs equal random signs): "
                f"held-out queries see {_f(q['num'])} of random signs' discrepancy (numerator; denominator "
                f"{_f(q['den'])}: a draw of random signs), where greedy would reach {_f(q['greedy_num'])} (denominator "
                f"{_f(q['greedy_den'])}); {gram}")
    if q["num"] < BALANCES:
        return (f"{who} balances what held-out queries see: {_f(q['num'])} of random signs' discrepancy (numerator; "
                f"denominator {_f(q['den'])}; greedy {_f(q['greedy_num'])}); {gram}")
    could = (f"greedy would reach {_f(q['greedy_num'])}" if q["greedy_num"] < BALANCES else
             f"nor does greedy, {_f(q['greedy_num'])}")
    return f"{who} does not balance what held-out queries see ({_f(q['num'])} of random signs'; {could}); {gram}"


def sentence(s: dict | None, *, walk: str = "theorem") -> str:
    """The cause in words for one side (raw or centred) of a setting. ``walk``: "theorem" (the walk at the theorem's
    c: the pseudocode, Alg. 1, the streaming press) or "released" (the authors' gamma = 4 rule). In the query side's
    terms where it was measured (:func:`query_side`), else the Gram yardstick's, named as such."""
    if not s:
        return "not measured"
    q = query_side(s, walk)
    if q is not None:
        return _query_sentence(q, walk)
    off, greedy = _med(s, "offdiag_share"), _med(s, "greedy_disc_ratio")
    same, own = _med(s, f"{walk}_equal_random"), _med(s, f"{walk}_disc_ratio")
    if off is None or greedy is None:
        return "not measured"
    if walk == "theorem" and same is not None and same >= COIN:
        return (f"the theorem's c makes the walk a coin ({100 * same:.0f}% of signs equal random signs); the Gram "
                f"yardstick: greedy keeps {greedy:.2f} of random signs' discrepancy (off-diagonal share {off:.2g}; no "
                f"held-out queries measured here)")
    who = "the released walk" if walk == "released" else "the walk"
    if greedy >= NOTHING_TO_BALANCE:
        return (f"the Gram yardstick sees nothing for {who} to balance (greedy keeps {greedy:.2f} of random signs' "
                f"discrepancy, off-diagonal share {off:.2g}; no held-out queries measured here)")
    return (f"{who} keeps {own:.2f} of random signs' Gram discrepancy (greedy {greedy:.2f}; {100 * same:.0f}% of its "
            f"signs equal random signs; no held-out queries measured here)" if own is not None and same is not None
            else f"the Gram yardstick has something to balance (off-diagonal share {off:.2g}, greedy {greedy:.2f})")


def cause_text(cause: dict | None, *, walk: str = "theorem") -> str:
    """Raw and centred in one clause: "<raw>; with the released code's key centring: <centred>"."""
    if not cause:
        return "not measured"
    raw, cen = sentence(cause.get("raw"), walk=walk), sentence(cause.get("centred"), walk=walk)
    return f"{raw}; {CENTRING}: {cen}"


def per_setting(records, setting, *, key: str = "walk_cause", kernel: str | None = None) -> dict:
    """{setting(record): merged cause} over the records that carry ``extra[key]`` (``kernel``: that kernel's entry
    of a blockwise record)."""
    groups: dict = {}
    for r in records:
        c = r.extra.get(key)
        if isinstance(c, dict) and kernel is not None:
            c = c.get(kernel)
        if isinstance(c, dict) and "raw" in c:
            groups.setdefault(setting(r), []).append(c)
    return {s: merge_sides(cs) for s, cs in sorted(groups.items(), key=lambda kv: str(kv[0]))}


def settings_text(causes: dict, *, walk: str = "theorem") -> str:
    """"<setting>: <cause text>" per setting, joined by " | "."""
    return " | ".join(f"{s}: {cause_text(c, walk=walk)}" for s, c in causes.items() if c)


def cause_finding(claim: str, causes: dict, *, what: str, walk: str = "theorem") -> Finding | None:
    """The BalanceKV cards' finding: what the walk has to balance, per setting (``what``: which walk, e.g. "Alg. 1's
    MergeAndReduce walks on the power streams"). None without measurements."""
    causes = {s: c for s, c in causes.items() if c}
    if not causes:
        return None
    return Finding(claim, "what the walk has to balance, measured (with and without the released code's key "
                          "centring)", f"{what}: {settings_text(causes, walk=walk)}. {THRESHOLDS}", {},
                   kind="finding")


def blockwise_text(records, variants, names: dict, setting) -> tuple[list[str], Finding | None]:
    """The blockwise checks' (BKV.vs-uniform, BKV.ablation) cause per variant and setting: the summary's clauses
    ("<variant's name>: <setting>: <cause> | ...") and one finding for the card. ``records``: the variants' records
    (``check == "error <variant>"``) carrying ``walk_cause``; a variant whose kernel an earlier one shares is left out."""
    parts, lines, kernels = [], [], set()
    for v in variants:
        kernel, walk = VARIANT_KERNELS.get(v, (v, "theorem"))
        if kernel in kernels:
            continue
        causes = per_setting([r for r in records if r.check == f"error {v}"], setting)
        if not causes:
            continue
        kernels.add(kernel)
        text = settings_text(causes, walk=walk)
        parts.append(f"what the walk of {names.get(v, v)} has to balance (first-level blocks): {text}")
        lines.append(f"{names.get(v, v)}: {text}")
    if not lines:
        return parts, None
    return parts, Finding(records[0].claim if records else "", "what the walk has to balance, measured (with and "
                          "without the released code's key centring)", "first-level blocks of each variant's kernel; "
                          + " || ".join(lines) + f". {THRESHOLDS}", {}, kind="finding")
