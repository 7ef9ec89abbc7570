"""Shared by BKV.decode and SG.decode: SmolLM2 generates greedily with a streaming press
(:mod:`kvbounds.presses`), and at checkpoints every layer's compressed attention output is compared with exact
attention over that layer's whole history (the keys and values the same run computed), at the query of the current
step, with the battery of controls (:mod:`kvbounds.battery`: zeros, the mean, StreamingLLM with the press's sink,
uniform with the press's sink and window) at the floats the press holds then (its keys, values and per-token
log-weights, :func:`kvbounds.battery.cache_floats`), the press's ablation where it is computed from the history
(``ablation``: SubGen's layout with uniform samples) and the press's live certificate. BalanceKV's ablation (the
same press with random halving) is a second run on the same tokens (:func:`run_forced`), merged by
:func:`merge_ablation`.

Units: ``||o_hat - o|| / (||softmax||_2 ||V_j||_F)`` (BalanceKV-NeurIPS Thm 3.1) or ``/ (||softmax||_2 ||V_j||_op)``
(SubGen Thm 1; the softmax is the model's own, so SubGen's logit convention without 1/sqrt(d) changes nothing but
the norm of V). One generation gives one record per (checkpoint, layer) and one power record per layer.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from kvbounds import battery
from kvbounds.algorithms.compressed_kv import CompressedKV
from kvbounds.algorithms.validation import InputError, check_choice, check_error
from kvbounds.battery import cache_floats
from .common import pick

PROFILES = {  # prompt tokens, new tokens, target, interval, sink, window, checkpoint every
    "smoke": dict(prompt=64, new=32, target=48, interval=16, sink=4, window=8, every=16, model="tiny"),
    # quick: the press holds 48-64 of 224 tokens at the last checkpoint (21-29% of the history's floats; target 96
    # held 43-57%, no real compression)
    "quick": dict(prompt=128, new=96, target=48, interval=16, sink=4, window=16, every=32),
    # full: 20 generations (the units) of the quick one's size: one of 512 + 1024 tokens cost ~10x a quick one, and 20
    # of them are past the full profile's budget; the rate in n is not decided on a vacuous bound anyway
    "full": dict(prompt=128, new=96, target=48, interval=16, sink=4, window=16, every=32),
}
FAMILY = "SmolLM2 greedy decode"
FAMILIES = {"smollm2": FAMILY, "tiny": "tiny random Llama greedy decode (smoke: plumbing only)"}


def trial_params(profile: str) -> dict:
    """The profile's generation; smoke runs a tiny random Llama (the default test run stays fast), the others
    SmolLM2 (gpu: as full)."""
    check_choice(profile, "profile", ("smoke", "quick", "full", "gpu"))
    return dict({"model": "smollm2"}, **pick(profile, smoke=PROFILES["smoke"], quick=PROFILES["quick"],
                                             full=PROFILES["full"]))


GENERATIONS = {"smoke": 1, "quick": 1, "full": 20}     # generations from distinct prompts: the units


def trials(profile: str) -> list[dict]:
    """The trials of BKV.decode and SG.decode: one generation each, :data:`GENERATIONS` of them (the unit of
    replication: a generation from a distinct prompt; quick has one, so its calls are not attainable, full 20).
    Generation i's prompt is the start of the corpus's text i (:mod:`kvbounds.traces.corpus`)."""
    base = trial_params(profile)
    return [dict(base, prompt_text=i) for i in range(GENERATIONS["full" if profile == "gpu" else profile])]


@functools.lru_cache(maxsize=1)
def decode_model(spec: str):
    """The model a decode check runs: "tiny" (:func:`tiny_model`) or a name :func:`kvbounds.e2e.load_model`
    reads (cached: one per process)."""
    if spec == "tiny":
        return tiny_model()
    from kvbounds.e2e import load_model
    return load_model(spec)


def tiny_model():
    """A seeded random 2-layer Llama with the weighted attention, and an encoder mapping bytes to its vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from kvbounds.e2e import use_weighted_attention
    from kvbounds.e2e import LoadedModel
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg).eval()
    use_weighted_attention(model)
    encode = lambda text: np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    return LoadedModel(model=model, encode=encode, name="tiny random Llama")


def prompt_tokens(lm, n: int, seed: int, text: int | None = None):
    """``n`` token ids: the first ``n`` of the corpus's text number ``text`` (:func:`kvbounds.traces.corpus.texts`
    of at least 4 n characters: distinct generations read distinct texts), or, for ``text`` None (older records),
    of the default real text (:func:`kvbounds.traces.real.default_text`) from a seeded start."""
    if text is not None:
        from kvbounds.traces.corpus import text as corpus_text, texts
        names = texts(min_chars=4 * n)
        if not 0 <= text < len(names):
            raise InputError(f"prompt text {text} is beyond the corpus's {len(names)} texts of {4 * n} characters")
        ids = lm.encode(corpus_text(names[text]))
        if len(ids) < n:
            raise InputError(f"the corpus text {names[text]!r} has {len(ids)} tokens, fewer than the prompt's {n}")
        return ids[:n]
    from kvbounds.traces.real import default_text
    ids = lm.encode(default_text())
    start = int(np.random.default_rng(seed).integers(0, max(len(ids) - n, 1)))
    return ids[start:start + n]


def prompt_unit(params: dict, seed: int) -> str:
    """The unit of replication of a generation: its prompt's text (the corpus's text number ``prompt_text``), or
    for older params the seed of its start in the default text."""
    if params.get("prompt_text") is None:
        return f"generation (default text, seed {seed})"
    from kvbounds.traces.corpus import texts
    names = texts(min_chars=4 * params["prompt"])
    i = params["prompt_text"]
    return f"generation from {names[i] if 0 <= i < len(names) else i}"


def _queries(module, kwargs):
    """Post-RoPE queries of the last position: (b, H, d)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    hid = kwargs["hidden_states"]
    b, L, _ = hid.shape
    q = module.q_proj(hid).view(b, L, -1, module.head_dim).transpose(1, 2)
    cos, sin = kwargs["position_embeddings"]
    return apply_rotary_pos_emb(q, q, cos, sin)[0][:, :, -1]


class DecodeObserver:
    """The press's observer: keeps each layer's full history and measures at the checkpoints. ``ablation(press, K,
    V, rng, floats)`` -> CompressedKV of one KV head's history (K, V (n, d)) at the press's floats per KV head, the
    press's ablation, or None."""

    def __init__(self, params: dict, seed: int, ablation=None):
        self.p, self.hist, self.rows = params, {}, []
        self.rng = np.random.default_rng(seed + 3)
        self.ablation = ablation

    def __call__(self, press, module, kwargs, layer):
        import torch
        L = kwargs["hidden_states"].shape[1]
        i = module.layer_idx
        nk, nv = layer.keys[0, :, -L:].double().numpy(), layer.values[0, :, -L:].double().numpy()
        k, v = self.hist.get(i, ([], []))
        k.append(nk)
        v.append(nv)
        self.hist[i] = (k, v)
        n = layer.get_seq_length()
        step = n - self.p["prompt"]
        if L != 1 or step <= 0 or step % self.p["every"] or press.reductions == 0:
            return
        with torch.no_grad():
            self.measure(press, module, kwargs, layer, i, n)

    def measure(self, press, module, kwargs, layer, i: int, n: int) -> None:
        from kvbounds.presses import weighted_output
        from kvbounds.presses import log_weights
        scale = float(module.scaling)
        q = _queries(module, kwargs)
        est, _, _ = weighted_output(layer, q, scale)
        bar = press.certificate(i, layer, q, scale)                   # the press's own kind (bound / estimate)
        cert, vac = bar.value[0].numpy(), bar.vacuous[0].numpy()
        estimate = press.certificate(i, layer, q, scale, kind="estimate").value[0].numpy()
        est, q = est[0].numpy(), q[0].double().numpy()
        K = np.concatenate(self.hist[i][0], 1)
        V = np.concatenate(self.hist[i][1], 1)
        H, Hkv = q.shape[0], K.shape[0]
        stored = int(layer.keys.shape[-2])
        a, b = (x[0].double().numpy() for x in log_weights(layer))
        cache = CompressedKV(layer.keys[0].double().numpy(), layer.values[0].double().numpy(), a, b)
        floats = cache_floats(cache) // Hkv                        # per KV head: keys, values, log-weights
        ctl_g = []
        for g in range(Hkv):
            cs = battery.controls(K[g], V[g], floats, self.rng, sink=press.sink, window=press.window)
            if self.ablation is not None:
                cs["ablation"] = self.ablation(press, K[g], V[g], self.rng, floats)
            ctl_g.append(cs)
        # per KV group: ||V||_F, ||V||_op (from the d x d Gram, not an n x d SVD), the largest key and value norms
        vf = [float(np.linalg.norm(V[g])) for g in range(Hkv)]
        vop = [math.sqrt(max(float(np.linalg.eigvalsh(V[g].T @ V[g])[-1]), 0.0)) for g in range(Hkv)]
        kmax = [float(np.linalg.norm(K[g], axis=1).max()) for g in range(Hkv)]
        vmax = [float(np.linalg.norm(V[g], axis=1).max()) for g in range(Hkv)]
        row = dict(n=n, layer=i, stored=stored, d=int(q.shape[1]), kv_heads=int(Hkv), heads=[], floats=int(floats),
                   stream_floats=int(K.shape[1] * (K.shape[2] + V.shape[2])),
                   controls_floats={k: cache_floats(c) for k, c in ctl_g[0].items()})
        for h in range(H):
            g = h // (H // Hkv)
            x = K[g] @ q[h] * scale
            w = np.exp(x - x.max())
            w /= w.sum()
            exact = w @ V[g]
            err = float(np.linalg.norm(est[h] - exact))
            sm = float(np.linalg.norm(w))
            units = {"F": sm * vf[g], "op": sm * vop[g]}
            ctl = {name: float(np.linalg.norm(battery.attention(c, q[h], scale) - exact))
                   for name, c in ctl_g[g].items()}
            qn = float(np.linalg.norm(q[h]))
            row["heads"].append(dict(err=err, units=units, controls=ctl, cert=float(cert[h]), r=max(kmax[g], qn),
                                     kmax=kmax[g], vmax=vmax[g], qnorm=qn, cert_vacuous=bool(vac[h]),
                                     estimate=float(estimate[h]), exact_norm=float(np.linalg.norm(exact))))
        self.rows.append(row)


def run_generation(press_cls, params: dict, seed: int, *, ablation=None, tokens: list | None = None, **press_kw):
    """Generate with the press; returns (rows of measurements, the press). ``ablation``: the observer's (see
    :class:`DecodeObserver`); ``tokens``: a list that receives the generated sequence (prompt and new tokens)."""
    import torch
    from kvbounds.presses import generate
    lm = decode_model(params["model"])
    obs = DecodeObserver(params, seed, ablation)
    press = press_cls(target=params["target"], interval=params["interval"], sink=params["sink"],
                      window=params["window"], seed=seed, observer=obs, **press_kw)
    ids = torch.as_tensor(np.asarray(prompt_tokens(lm, params["prompt"], seed, params.get("prompt_text")))[None]).long()
    torch.set_num_threads(1)
    out = generate(lm.model, press, ids, params["new"])
    if tokens is not None:
        tokens.extend(int(x) for x in out[0].tolist())
    return obs.rows, press


def run_forced(press_cls, params: dict, seed: int, tokens, **press_kw):
    """The same measurements with another press fed the same tokens (``tokens``: the sequence a run of
    :func:`run_generation` produced, prompt first): the prompt in chunks of the press's interval, then one token per
    step, as :func:`kvbounds.presses.generate` feeds them, so every checkpoint and layer pairs with that run's.
    Returns the rows."""
    import inspect
    import torch
    from transformers import DynamicCache
    from kvbounds.presses import cache_keyword
    lm = decode_model(params["model"])
    obs = DecodeObserver(params, seed)
    press = press_cls(target=params["target"], interval=params["interval"], sink=params["sink"],
                      window=params["window"], seed=seed, observer=obs, **press_kw)
    ids = torch.as_tensor(np.asarray(tokens)[None]).long()
    n0 = params["prompt"]
    kw = {cache_keyword(lm.model): DynamicCache(), "use_cache": True}
    if "logits_to_keep" in inspect.signature(lm.model.forward).parameters:
        kw["logits_to_keep"] = 1
    torch.set_num_threads(1)
    with torch.no_grad(), press(lm.model):
        for i in range(0, n0, press.interval):
            lm.model(input_ids=ids[:, i:min(i + press.interval, n0)], **kw)
        for t in range(n0, ids.shape[1]):
            lm.model(input_ids=ids[:, t:t + 1], **kw)
    return obs.rows


def merge_ablation(rows, ablation_rows, units: str) -> list:
    """The method's rows with each head's ``controls["ablation"]``: the ablation run's error at the same (checkpoint,
    layer, head) in its own theorem units (``units``: "F" or "op") times the method's unit there, so that dividing
    by the method's unit (as the records do) gives the ablation's own eps. A row without a partner in the
    ablation run keeps no ablation (that control is missing there)."""
    check_choice(units, "units", ("F", "op"))
    other = {(r["n"], r["layer"]): r for r in check_rows(ablation_rows, units)}
    for r in check_rows(rows, units):
        o = other.get((r["n"], r["layer"]))
        if o is None or len(o["heads"]) != len(r["heads"]):
            continue
        for h, g in zip(r["heads"], o["heads"]):
            eps = in_units(g["err"], g["units"][units], "the ablation's error")
            unit = check_error(h["units"][units], "the method's unit")
            h["controls"]["ablation"] = eps * unit if unit > 0 and math.isfinite(eps) else \
                (math.inf if eps > 0 else 0.0)
        if "controls_floats" in r and "floats" in o:
            r["controls_floats"]["ablation"] = o["floats"]
    return rows


def in_units(err: float, unit: float, what: str = "error") -> float:
    """``err / unit``, the smallest eps with err <= eps unit: 0 when err = 0 (also at unit 0: all-zero values give
    an exact zero output), +inf when err > 0 at unit 0. A NaN or negative err or unit is an InputError naming it."""
    err, unit = check_error(err, what), check_error(unit, f"the unit of {what}")
    if err == 0:
        return 0.0
    return math.inf if unit == 0 else err / unit


def head_eps(h: dict, units: str) -> float:
    """A head's error in the theorem's units (``units``: "F" or "op"; :func:`in_units`)."""
    if not isinstance(h, dict) or not isinstance(h.get("units"), dict) or units not in h["units"] or "err" not in h:
        raise InputError(f"a head must be a dict with 'err' and units[{units!r}], got {h!r}"[:200])
    return in_units(h["err"], h["units"][units])


def check_rows(rows, units: str | None = None) -> list:
    """The measurement rows of :class:`DecodeObserver` (or rows like them): a list of dicts whose ``heads`` is a
    non-empty list of dicts with ``err``, ``cert``, ``vmax`` (and ``units[units]`` when ``units`` is given); an
    InputError names the first thing missing."""
    if isinstance(rows, (str, bytes, dict)) or not hasattr(rows, "__iter__"):
        raise InputError(f"rows must be a list of measurement rows, got {type(rows).__name__}")
    rows = list(rows)
    for i, row in enumerate(rows):
        hs = row.get("heads") if isinstance(row, dict) else None
        if not isinstance(hs, list) or not hs:
            raise InputError(f"rows[{i}] must be a dict with a non-empty list of heads")
        for h in hs:
            need = ("err", "cert", "vmax") + (("units",) if units else ())
            if not isinstance(h, dict) or not all(k in h for k in need) or (
                    units and (not isinstance(h["units"], dict) or units not in h["units"])):
                raise InputError(f"rows[{i}]: a head must be a dict with {', '.join(need)}"
                                 + (f" (units[{units!r}])" if units else "") + f", got {h!r}"[:160])
            for k in ("err", "cert", "vmax"):
                if isinstance(h[k], (bool, np.bool_)) or not isinstance(h[k], (int, float, np.integer, np.floating)):
                    raise InputError(f"rows[{i}]: a head's {k} must be a real number, got {h[k]!r}")
    return rows


def certificate_stats(rows) -> dict:
    """Coverage (err <= certificate), looseness (median certificate / err over the heads with err > 0) and vacuity
    (the press's own flag: the certificate is no smaller than ||o_hat|| + max ||v||, the bar the values alone give;
    older rows: certificate >= 2 max ||v||) over every (checkpoint, layer, head). A head whose certificate or error
    is NaN is counted in ``undefined`` and nowhere else (never covered, not in the median); an infinite certificate
    covers and is vacuous."""
    hs = [h for r in check_rows(rows) for h in r["heads"]]
    bad = lambda h: math.isnan(float(h["cert"])) or math.isnan(float(h["err"]))
    ok = [h for h in hs if not bad(h)]
    loose = [h["cert"] / h["err"] for h in ok if h["err"] > 0]
    return dict(heads=len(hs), covered=sum(h["err"] <= h["cert"] * (1 + 1e-6) for h in ok),
                looseness=float(np.median(loose)) if loose else math.nan,
                vacuous=sum(h.get("cert_vacuous", h["cert"] >= 2 * h["vmax"]) for h in ok), undefined=len(hs) - len(ok))
