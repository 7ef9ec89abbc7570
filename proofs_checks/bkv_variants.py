"""The BalanceKV variants measured side by side by BKV.vs-uniform and BKV.ablation, and what
they share: one selection per KV head shared by its query heads (GQA), split numerator/denominator
log-weights, the walk diagnostic, one-sided tests, and the differences between the paper's App. B text and
the authors' released code as findings ("versions disagree").

Variants (BalanceKV-NeurIPS = arXiv:2502.07861 v2):
  * ``balance``          the pseudocode: blockwise Alg. 2 as App. B writes it
                         (:func:`kvbounds.algorithms.blockwise_balance_kv.compress_cache`);
  * ``released-t1``      the released walk at run_longbench.py's defaults (gamma 4, temp 1),
                         the released estimator (:mod:`kvbounds.algorithms.balance_kv_released`);
  * ``released-t0.1``    the same at temp 0.1, as the single-layer notebook behind Fig. 1/3 calls it;
  * ``consistent-t0.1``  the released walk at temp 0.1 with the consistent estimator (log w in both sums);
  * ``uniform``          independent uniform sampling at equal memory (the paper's baseline).
"""
from __future__ import annotations

import hashlib
import math
import time

import numpy as np

from kvbounds.algorithms.balance_kv_released import FIGURE_TEMP, compress_cache_released, expand_groups, theory_walk_c
from kvbounds.battery import COIN_C
from kvbounds.algorithms.blockwise_balance_kv import compress_cache
from kvbounds.theory.empirical import mean_and_spread
from kvbounds.verdict import (Finding, Reproduction, combine_reproductions, finalize, reproduction_status,
                              statement_from_reproduction)

__all__ = ["ALPHA", "COIN_NOTE", "COIN_TOL", "RELEASED", "VARIANTS", "LABELS", "SHORT", "REGISTRY_VARIANT",
           "variant_name", "COIN_WORDS", "WORDS", "RECIPE", "INGREDIENTS", "walk_summary", "ABLATIONS",
           "ABLATION_OVERRIDES", "select", "causal_split", "head_errors", "exact_last", "run_variants", "per_kv_head",
           "reproduction", "combine", "finish", "version_findings", "text_of", "step_calls"]

ALPHA = 0.05
COIN_NOTE = "the walk is indistinguishable from random signs here; BalanceKV = stratified uniform sampling"
COIN_TOL = 1e-3            # mean |p - 1/2| below this at every level, and no clipped p: a fair coin

RELEASED = dict(gamma=4.0, temp=1.0, beta=0.0, kernel_const=0.025, center=True, carry_weights=True, walk_c=None)
VARIANTS = {
    "released-t1": dict(RELEASED, estimator="released"),
    "released-t0.1": dict(RELEASED, temp=FIGURE_TEMP, estimator="released"),
    "consistent-t0.1": dict(RELEASED, temp=FIGURE_TEMP, estimator="consistent"),
}
LABELS = {"balance": "pseudocode (App. B / Alg. 2)", "released-t1": "released walk, temp 1 (run_longbench.py)",
          "released-t0.1": "released walk, temp 0.1 (Fig. 1/3 notebook)",
          "consistent-t0.1": "released walk, temp 0.1, consistent estimator (log w in both sums)",
          "uniform": "independent uniform sampling"}
SHORT = {"balance": "the pseudocode", "released-t1": "the released walk at temp 1",
         "released-t0.1": "the released walk at temp 0.1",
         "consistent-t0.1": "the released walk with the consistent estimator"}
# each variant's words from the method registry (kvbounds.methods.VARIANT_WORDS): what a headline calls it
REGISTRY_VARIANT = {"balance": "pseudocode", "released-t1": "released", "released-t0.1": "released-t0.1",
                    "consistent-t0.1": "consistent-t0.1"}


def variant_name(name: str) -> str:
    """The words for a BalanceKV variant of these checks (the method registry's), e.g. "pseudocode walk at the
    theorem's c (= random halving)"; the name itself for anything else."""
    from kvbounds.methods import variant_words
    return variant_words("BalanceKV", REGISTRY_VARIANT[name]) if name in REGISTRY_VARIANT else name


COIN_WORDS = "its walk reduces to random halving here"
WORDS = {"reproduced": "reproduced", "partial": "partly reproduced", "not-reproduced": "not reproduced",
         "not-shown": "not shown (underpowered)", "reversed": "reversed", "n/a": "n/a"}

# the ingredient ablation: from the released recipe (temp 0.1, released estimator) change one thing
RECIPE = VARIANTS["released-t0.1"]
INGREDIENTS = {
    "recipe": {},
    "walk constant of the theory (p = 1/2 - x/(2 c R^2))": dict(walk_c="theory"),
    "no centring": dict(center=False),
    "temp 1": dict(temp=1.0),
    "gamma 0 (random signs, same cut)": dict(gamma=0.0),
    "gamma 0.4": dict(gamma=0.4),
    "kernel constant 0": dict(kernel_const=0.0),
    "weights not carried into the kernel": dict(carry_weights=False),
    "weights dropped (2^T in both sums)": dict(estimator="unweighted"),
    "consistent estimator (log w in both sums)": dict(estimator="consistent"),
}


def walk_summary(diag: list[dict]) -> dict:
    """The per-level diagnostic and whether the walk is a fair coin (the note the report prints)."""
    if not diag:
        return {}
    coin = all(d["mean_abs_p_dev"] < COIN_TOL and d["clipped"] == 0 for d in diag)
    return dict(walk=diag, walk_is_coin=coin, walk_note=COIN_NOTE if coin else "",
                walk_max_abs_p_dev=max(d["mean_abs_p_dev"] for d in diag),
                walk_clipped=float(np.mean([d["clipped"] for d in diag])))


# each BalanceKV variant's ablation (random signs, the same cut and estimator): the pseudocode at COIN_C, the released
# walk at gamma = 0 (its p = sigmoid(-gamma <w, u>) is then 1/2)
ABLATIONS = {"balance": "balance-coin", "released-t1": "released-coin", "released-t0.1": "released-coin",
             "consistent-t0.1": "consistent-coin"}
ABLATION_OVERRIDES = {"released-coin": dict(gamma=0.0), "consistent-coin": dict(gamma=0.0, estimator="consistent")}


def select(name: str, K, V, *, T, sink, window, block_size, rng, group: int = 1, diagnostics=None, **over):
    """(indices, log_w_num, log_w_den) for the query heads, from one selection per KV head (K, V per KV head).
    ``name``: a variant, "uniform", or "balance-coin" (the pseudocode's ablation: fair coins on the walk's own
    uniforms, the same blocks and cut, kvbounds.battery.COIN_C)."""
    if name in ("balance", "balance-coin"):
        idx, lw = compress_cache(K, V, sink=sink, window=window, levels=T, block_size=block_size, rng=rng,
                                 diagnostics=diagnostics, c=COIN_C if name == "balance-coin" else None)
        lwn = lwd = lw
    elif name == "uniform":
        idx, lw = compress_cache(K, V, sink=sink, window=window, levels=T, block_size=block_size, rng=rng,
                                 method="uniform")
        lwn = lwd = lw
    else:
        cfg = dict(VARIANTS.get(name, RECIPE), **over)
        if cfg.get("walk_c") == "theory":
            cfg["walk_c"] = theory_walk_c(block_size)
        est = cfg.pop("estimator")
        idx, lwn, lwd = compress_cache_released(K, V, sink=sink, window=window, levels=T, block_size=block_size,
                                                rng=rng, estimator=est, diagnostics=diagnostics, **cfg)
    return tuple(expand_groups(np.asarray(x), group) for x in (idx, lwn, lwd))


def causal_split(Qw, qpos, K, V, idx, lwn, lwd):
    """z_j = sum_i e^{s_ij + lwn_i} v_i / sum_i e^{s_ij + lwd_i} over kept tokens i <= j (torch CPU, float64)."""
    import torch
    H, _, d = K.shape
    idx_t = torch.as_tensor(np.array(idx, dtype=np.int64))
    lwn_t, lwd_t = (torch.as_tensor(np.array(np.broadcast_to(np.asarray(x, np.float64), idx.shape))) for x in (lwn, lwd))
    Kt, Vt = torch.as_tensor(K), torch.as_tensor(V)
    Ks = torch.gather(Kt, 1, idx_t[..., None].expand(-1, -1, d))
    Vs = torch.gather(Vt, 1, idx_t[..., None].expand(-1, -1, Vt.shape[-1])) * torch.exp(lwn_t - lwd_t)[..., None]
    lg = torch.bmm(torch.as_tensor(Qw), Ks.transpose(1, 2)) / math.sqrt(d) + lwd_t[:, None, :]
    lg = lg.masked_fill(idx_t[:, None, :] > torch.as_tensor(qpos)[None, :, None], -math.inf)
    return torch.bmm(torch.softmax(lg, dim=-1), Vs).numpy()


def head_errors(z, exact) -> np.ndarray:
    """Per query head: mean over queries of ||z_j - Attn_j|| / ||Attn_j|| (BalanceKV-NeurIPS App. B.1)."""
    return np.mean(np.linalg.norm(z - exact, axis=-1) / np.linalg.norm(exact, axis=-1), axis=-1)


_EXACT: dict = {}


def exact_last(Q, K, V, window: int, causal: bool = True):
    """Exact attention of the last ``window`` queries (H, w, e) and their positions (kept for the last trace
    seen: the trials of one layer share it)."""
    h = hashlib.blake2b(digest_size=16)
    for a in (Q[:, -window:], K, V):
        h.update(np.ascontiguousarray(a).tobytes())
    key = (h.hexdigest(), Q.shape, K.shape, window, causal)
    if key in _EXACT:
        return _EXACT[key]
    _EXACT.clear()
    n = K.shape[1]
    qpos = np.arange(n - window, n)
    full = np.broadcast_to(np.arange(n), (K.shape[0], n))
    z = causal_split(Q[:, qpos], qpos if causal else np.full(window, n), K, V, full, 0.0, 0.0)
    _EXACT[key] = (z, qpos)
    return z, qpos


def run_variants(Q, K, V, *, T, sink, window, block_size, seeds, group: int = 1, causal: bool = True,
                 methods=("balance", "released-t1", "released-t0.1", "consistent-t0.1", "uniform"),
                 overrides: dict | None = None, control: str | None = None) -> dict:
    """Per method: the per-query-head errors (seeds, H), the selection times, and the walk diagnostic of the
    first seed. ``overrides``: extra methods name -> dict of changes to the released recipe (the ablation).
    ``control``: a method name whose log-weights are dropped (weights 1 in both sums) as a negative control."""
    exact, qpos = exact_last(Q, K, V, window, causal)
    Qw = Q[:, qpos]
    Kkv, Vkv = K[::group], V[::group]
    todo = [(m, {}) for m in methods] + list((overrides or {}).items())
    names = [m for m, _ in todo]
    out = {m: [] for m, _ in todo}
    times = {m: [] for m, _ in todo}
    diags: dict = {}
    if control:
        out[f"{control}-unweighted"] = []
    for si, s in enumerate(seeds):
        for mi, (m, over) in enumerate(todo):
            # the ablation's changed recipes share their draws (common random numbers)
            # an ablation by coins draws the uniforms of the variant it ablates (the walk's own uniforms)
            ri = names.index("balance") if m == "balance-coin" and "balance" in names else mi
            rng = np.random.default_rng([int(s), 1000 if (over or m == "recipe") else ri])
            diag = [] if si == 0 and m != "uniform" and not m.endswith("-coin") else None
            base = m if not over else "released-t0.1"
            t0 = time.perf_counter()
            idx, lwn, lwd = select(base, Kkv, Vkv, T=T, sink=sink, window=window, block_size=block_size, rng=rng,
                                   group=group, diagnostics=diag, **over)
            times[m].append(time.perf_counter() - t0)
            if diag:
                diags[m] = diag
            out[m].append(head_errors(causal_split(Qw, qpos, K, V, idx, lwn, lwd), exact))
            if m == control:
                z0 = np.zeros(idx.shape)
                out[f"{m}-unweighted"].append(head_errors(causal_split(Qw, qpos, K, V, idx, z0, z0), exact))
    n = K.shape[1]
    return {"errors": {m: np.asarray(v) for m, v in out.items()}, "times": times, "diagnostics": diags,
            "budget": sink + window + ((n - sink - window) >> T)}


def per_kv_head(err: np.ndarray, group: int) -> list[float]:
    """Mean error per KV head (its query-head group), averaged over seeds: err (seeds, H)."""
    H = err.shape[1]
    return [float(err[:, g * group:(g + 1) * group].mean()) for g in range(max(H // group, 1))]


def text_of(r) -> str:
    """The unit of a record: the text it reads (its layers and the seeds inside it are one unit); the trace without
    its layer for the default text."""
    import re
    return r.extra.get("unit") or re.sub(r":L\d+", "", str(r.params.get("trace", "")))


def step_calls(cells: list[tuple]) -> list[dict]:
    """The one rule's calls (:func:`kvbounds.verdict.paired_calls`, Holm over the cells given) of
    [(family, control, records)]: each record's ``measured`` (the method, its seeds' mean) against its ``bound`` (the
    reference), lower is better, per unit a text (:func:`text_of`; its layers summarised by their median)."""
    from kvbounds.verdict import Comparison, paired_calls, per_unit
    comps = []
    for family, control, recs in cells:
        m, b = (per_unit((text_of(r), value(r)) for r in recs) for value in (lambda r: r.measured, lambda r: r.bound))
        keys = sorted(m)
        comps.append(Comparison(family, control, [m[k] for k in keys], [b[k] for k in keys],
                                reason="" if keys else "no records"))
    return [c.as_dict() for c in paired_calls(comps, unit="distinct texts (seeds and layers averaged within)",
                                              metric="practitioner")]


def reproduction(variant: str, calls: list[dict], setup: str, gates=None) -> Reproduction:
    """One Reproduction from a variant's calls (:func:`step_calls`; verdict.reproduction_status, test-type): a call
    counts as better only where its ``gates`` entry is True (e.g. the runtime rose); a call not attainable with its
    units makes a miss ``not-shown``."""
    gates = list(gates) if gates is not None else [True] * len(calls)
    b = sum(c["call"] == "better" and g for c, g in zip(calls, gates))
    w = sum(c["call"] == "worse" for c in calls)
    short = [c for c in calls if c["call"] == "not attainable"]
    st = reproduction_status(b, w, len(calls), kind="test", powered=not short)
    note = (f"underpowered: not attainable with {short[0]['n']} unit(s) (smallest p = {short[0]['smallest_p']:.2g})"
            if short and st == "not-shown" else "")
    units = sorted({c["n"] for c in calls})
    return Reproduction(variant, st, setup, f"{LABELS.get(variant, variant)}: better in {b}/{len(calls)} cells, worse "
                        f"in {w} (the one rule at the unit, a text: {'/'.join(map(str, units))} text(s), seeds and "
                        f"layers averaged within; Holm over the {len(calls)} cells)", bound_note=note)


def combine(reps) -> str:
    """One label over variants (:func:`kvbounds.verdict.combine_reproductions`)."""
    return combine_reproductions(reps)


def finish(v, per_variant: str):
    """The shared rules fill the derived fields (:func:`kvbounds.verdict.finalize`; the statement of an empirical
    claim measured on another setup than the paper's follows :func:`statement_from_reproduction`); the headline
    names each variant's reproduction (``per_variant``, kept in ``v.variant`` so that every later finalize keeps it)."""
    v.kind = "empirical"
    v.statement = statement_from_reproduction(v.reproduction)
    v.variant = per_variant or v.variant
    return finalize(v)


def version_findings(claim: str) -> list[Finding]:
    """BalanceKV-NeurIPS App. B's text vs the released code (ksheth96/BalanceKV): one finding per ingredient."""
    k = "versions disagree"
    app_b = "BalanceKV-NeurIPS App. B (arXiv:2502.07861 v2) says: run Alg. 2 (SoftmaxBalance) per block"
    rel = "the released code (ksheth96/BalanceKV, src/balanced_walk.py)"
    items = [
        ("walk constant", f"{app_b}, p = 1/2 - x/(2c) on the kernel divided by R^2 = e^{{r^2/sqrt d}} r_v^2, "
                          f"c = 30 log(b/delta); {rel} uses p = 1/2 - gamma x with gamma = 4 and no c or R^2, so p "
                          "is almost always clipped to 0 or 1 (a nearly greedy walk)."),
        ("key centring", f"{app_b} on the keys as cached; {rel} subtracts each block's mean key (the mean includes "
                         "the zero padding rows) before the kernel."),
        ("kernel", f"Alg. 2 balances e^{{<k_i,k_j>/sqrt d}} <v_i, v_j>; {rel} uses "
                   "exp(temp <k~_i,k~_j>/sqrt d - beta) (<w_i v_i, w_j v_j> + 0.025 + 1e-8), temp = 1 in "
                   "run_longbench.py and 0.1 in the single-layer notebook behind Fig. 1/3."),
        ("first sign", f"Alg. 2 draws every sign; {rel} fixes the first sign of each block to +1."),
        ("selection", f"{app_b}, then 'strictly select n/2 embeddings' (Alg. 2 keeps one sign class); {rel} makes "
                      "one cut over the whole row at the first index where one sign class reaches n/2, keeps the "
                      "other class before the cut with weight 2 and every token after it with weight 1."),
        ("weights", f"Alg. 1/2 weight every kept token 2 per level (2^T); {rel} multiplies per-level weights in "
                    "{2, 1}, and feeds w v (not v) into the next level's kernel."),
        ("estimator", "BalanceKV-NeurIPS Alg. 1 scales both numerator and denominator sums by 2^T; the released decode "
                      "(src/llama_forward.py) multiplies kept values by w/2^T and adds log 2^T to their logits: "
                      "numerator weights w, denominator weights 2^T."),
        ("GQA", "BalanceKV-NeurIPS treats one attention head; the released code selects once per KV head and the query heads "
                "of a group share that selection."),
    ]
    return [Finding(claim, f"App. B vs released code: {name}", text, {}, kind=k) for name, text in items]
