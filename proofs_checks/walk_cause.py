"""Why BalanceKV's walk does or does not balance, in the BalanceKV checks' records and verdicts (BKV.attention,
BKV.vs-uniform, BKV.ablation, BKV.decode, BKV.e2e).

Each check stores one field per record, ``extra["walk_cause"]``: ``{"raw": summary, "centred": summary}`` where a
summary is :func:`kvbounds.algorithms.walk_diagnostics.summarize_diagnostics`'s ``{number: {median, min, max},
"blocks": N}`` over the blocks (or pair groups) the walk saw, without and with the released code's key centring
(each block's keys minus their mean; :mod:`kvbounds.battery.walk_probe` records the walks of a running stream,
:func:`kvbounds.algorithms.walk_diagnostics.blockwise_walk_cause` measures the first-level blocks of blockwise
BalanceKV). Blockwise checks store one such pair per kernel (``{"balance": ..., "released-t0.1": ...}``) and each
variant's record its own kernel's.

The verdict reads three numbers per setting (a stream family, a layer, a model), medians over blocks:

* the off-diagonal share of the exp-kernel Gram the walk balances (0: a diagonal Gram, every signing has the same
  discrepancy: nothing to balance);
* the share of the walk's signs equal to the random-sign rule's from the same uniforms (1: the walk is a coin);
* the discrepancy a greedy walk keeps of independent random signs' (eta^T G eta / tr G; 1: not even greedy
  balances) and the walk's own.

and says which of two causes makes the walk random halving there (thresholds below):
"the walk has nothing to balance at these norms (off-diagonal share X, greedy keeps Y of random signs' discrepancy)"
where even greedy keeps at least ``NOTHING_TO_BALANCE`` of it, else "the theorem's c makes the walk a coin (Z% of
signs equal random signs) although greedy reaches Y" where at least ``COIN`` of the signs equal random signs', else
that the walk balances.
"""
from __future__ import annotations

import numpy as np

from kvbounds.verdict import Finding

# greedy (the c -> 0 limit of the walk, the sign that lowers the running discrepancy most) keeps >= 90% of random
# signs' discrepancy in the median block: no walk can balance much there (measured 0.97-1 on SmolLM2 past layer 0,
# 0.14-0.86 where the kernel has off-diagonal mass; walk_diagnostics' docstring)
NOTHING_TO_BALANCE = 0.9
COIN = 0.95           # >= 95% of the walk's signs equal the random rule's: its probabilities moved (almost) no sign
NUMBERS = ("offdiag_share", "theorem_equal_random", "theorem_disc_ratio", "released_equal_random",
           "released_disc_ratio", "greedy_disc_ratio", "random_disc_ratio", "key_energy", "key_distance")
CENTRING = "with the released code's key centring"
# the kernel whose walk each blockwise variant runs (walk_diagnostics.KERNELS) and the walk's rule
VARIANT_KERNELS = {"balance": ("balance", "theorem"), "balance-unweighted": ("balance", "theorem"),
                   "released-t1": ("released-t1", "released"), "released-t0.1": ("released-t0.1", "released"),
                   "consistent-t0.1": ("released-t0.1", "released")}
_BLOCKWISE: dict = {}
CACHED = 16          # layouts kept per process (a few hundred numbers each): the trials of one layer share them


def blockwise_cause(trace: str, K, V, *, block_size: int, sink: int, window: int, kernels) -> dict:
    """:func:`kvbounds.algorithms.walk_diagnostics.blockwise_walk_cause` on the first-level blocks of one layer's
    KV heads, its uniforms seeded from the trace's name and the layout (the same numbers for every trial of a layer,
    whatever its seed or T; computed once per process and layout: the last ``CACHED`` layouts are kept)."""
    import zlib
    from kvbounds.algorithms import walk_diagnostics as wd
    key = (trace, int(block_size), int(sink), int(window), tuple(kernels))
    if key not in _BLOCKWISE:
        rng = np.random.default_rng([7, zlib.crc32(repr(key).encode())])
        while len(_BLOCKWISE) >= CACHED:
            _BLOCKWISE.pop(next(iter(_BLOCKWISE)))
        _BLOCKWISE[key] = wd.blockwise_walk_cause(K, V, block_size=block_size, sink=sink, window=window,
                                                  kernels=tuple(kernels), rng=rng)
    return _BLOCKWISE[key]


def merge(summaries) -> dict | None:
    """One summary from several (streams, layers, trials of one setting): per number the median of the medians, the
    smallest minimum and the largest maximum; ``blocks`` summed. None when none is given."""
    summaries = [s for s in summaries if isinstance(s, dict) and s.get("blocks")]
    if not summaries:
        return None
    out = {"blocks": int(sum(s["blocks"] for s in summaries))}
    for k in NUMBERS:
        vals = [s[k] for s in summaries if isinstance(s.get(k), dict)]
        if len(vals) == len(summaries):
            out[k] = dict(median=float(np.median([v["median"] for v in vals])),
                          min=float(min(v["min"] for v in vals)), max=float(max(v["max"] for v in vals)))
    return out


def merge_sides(causes) -> dict | None:
    """{"raw": merged, "centred": merged} from several ``{"raw": ..., "centred": ...}``; None without any."""
    causes = [c for c in causes if isinstance(c, dict) and "raw" in c]
    if not causes:
        return None
    return {side: merge([c.get(side) for c in causes]) for side in ("raw", "centred")}


def _med(s: dict, k: str) -> float | None:
    return s[k]["median"] if isinstance(s.get(k), dict) else None


def sentence(s: dict | None, *, walk: str = "theorem") -> str:
    """The cause in words for one side (raw or centred) of a setting. ``walk``: "theorem" (the walk at the theorem's
    c: the pseudocode, Alg. 1, the streaming press) or "released" (the authors' gamma = 4 rule)."""
    if not s:
        return "not measured"
    off, greedy = _med(s, "offdiag_share"), _med(s, "greedy_disc_ratio")
    same, own = _med(s, f"{walk}_equal_random"), _med(s, f"{walk}_disc_ratio")
    if off is None or greedy is None:
        return "not measured"
    if greedy >= NOTHING_TO_BALANCE:
        return (f"the walk has nothing to balance at these norms (off-diagonal share {off:.2g}, greedy keeps "
                f"{greedy:.2f} of random signs' discrepancy)")
    if walk == "theorem" and same is not None and same >= COIN:
        return (f"the theorem's c makes the walk a coin ({100 * same:.0f}% of signs equal random signs) although "
                f"greedy reaches {greedy:.2f} of random signs' discrepancy")
    who = "the released walk" if walk == "released" else "the walk"
    return (f"{who} balances: it keeps {own:.2f} of random signs' discrepancy (greedy {greedy:.2f}; "
            f"{100 * same:.0f}% of its signs equal random signs)" if own is not None and same is not None else
            f"the kernel has something to balance (off-diagonal share {off:.2g}, greedy reaches {greedy:.2f})")


def cause_text(cause: dict | None, *, walk: str = "theorem") -> str:
    """Raw and centred in one clause: "<raw>; with the released code's key centring: <centred>" (the centred half
    shortened to "the same" when it says the same thing)."""
    if not cause:
        return "not measured"
    raw, cen = sentence(cause.get("raw"), walk=walk), sentence(cause.get("centred"), walk=walk)
    if raw.split(" (")[0] == cen.split(" (")[0] and cen != "not measured":
        s = cause["centred"]
        same = _med(s, f"{walk}_equal_random")
        cen = (f"the same (off-diagonal share {_med(s, 'offdiag_share'):.2g}, greedy keeps "
               f"{_med(s, 'greedy_disc_ratio'):.2f}" + (f", {100 * same:.0f}% of signs equal random signs)"
                                                         if same is not None else ")"))
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
                          "centring)", f"{what}: {settings_text(causes, walk=walk)}. Thresholds: 'nothing to "
                   f"balance' where greedy keeps >= {NOTHING_TO_BALANCE:g} of random signs' discrepancy in the median "
                   f"block; 'a coin' where >= {100 * COIN:.0f}% of the walk's signs equal random signs'", {},
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
                          + " || ".join(lines) + f". Thresholds: 'nothing to balance' where greedy keeps >= "
                          f"{NOTHING_TO_BALANCE:g} of random signs' discrepancy in the median block; 'a coin' where "
                          f">= {100 * COIN:.0f}% of the walk's signs equal random signs'", {}, kind="finding")
