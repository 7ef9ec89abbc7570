"""Stream families on which an attention-error claim is compared with the battery of controls (:mod:`kvbounds.battery`;
the rule is :func:`kvbounds.battery.power_vs_controls`). Used by BKV.attention, SG.attention and MR.error (and the
records of every claim with a power table: :func:`battery_record`, :class:`StreamBattery`).

Families (``FAMILIES``):
  * ``synthetic benign``   today's streams: random unit keys and queries of norm r (near-uniform softmax, where
                           the mean of the values is almost exact); ``benign="clustered"`` in the params gives
                           SubGen's clusterable keys (``make_trace("clustered")``) instead;
  * ``concentrated``       keys in a few tight clusters plus ``HEAVY`` heavy tokens early in the stream; every
                           query points at one heavy token, with logit gap about ``GAP`` (in the claim's own logit
                           scale; less the clusters' noise along the query, ~0.05 GAP / sqrt(d) per key) over the
                           clusters: most of the softmax mass on a few tokens;
  * ``real SmolLM2`` / ``real MiniLM``  queries, keys and values of one (layer, query head) of the model on the
                           cached text (``kvbounds.traces.real.layer_heads``), a random window of n tokens; each
                           stream draws its layer, head and window from its seed (a sample on quick, more streams on
                           full). A missing model gives a record that says so (``extra["missing"]``), never a crash.

Each stream is (Q, K, V, r) with r the largest key or query norm; queries are in the claim's own convention:
``scale`` is the factor of <q, k> inside the exponential (1/sqrt(d) for BalanceKV, 1 for SubGen, whose real-trace
queries are divided by sqrt(d) so that exp(<q', k>) is the model's attention).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from kvbounds.algorithms.validation import InputError, check_choice, check_error, check_int, check_real, check_rng

from kvbounds.core import make_record, pick, unit_directions

FAMILIES = ("synthetic benign", "concentrated", "real SmolLM2", "real MiniLM")
REAL = {"real SmolLM2": ("smollm2", 2048), "real MiniLM": ("minilm", 512)}
HEAVY, GAP, POWER_CHECK = 4, 5.0, "trivial controls"
PROFILE_NAMES = ("smoke", "quick", "full", "gpu")
MAX_TOKENS, MAX_DIM = 10**8, 10**5       # beyond: not a stream this module builds (refused, not a memory error)


def _record_fields(claim, params, source) -> None:
    if not isinstance(claim, str) or not isinstance(source, str):
        raise InputError(f"claim and source must be strings, got {claim!r} and {source!r}")
    if not isinstance(params, dict):
        raise InputError(f"params must be a dict, got {type(params).__name__}")


def streams_per_family(profile: str) -> int:
    """Streams per family: 20 on quick (a 20% difference detectable at the spread the families show), 40 on full."""
    check_choice(profile, "profile", PROFILE_NAMES)
    return pick(profile, smoke=2, quick=20, full=40)


def power_trials(profile: str, base: dict, per_family: dict | None = None) -> list[dict]:
    """One trial per (family, stream): :func:`streams_per_family` streams per family (>= 10, the power rule's
    minimum); ``per_family``: parameters that differ by family (a memory setting at 10-30% of each family's
    stream), ``{family: {key: value}}``."""
    check_choice(profile, "profile", PROFILE_NAMES)
    if not isinstance(base, dict):
        raise InputError(f"base must be a dict of the trials' parameters, got {type(base).__name__}")
    if per_family is not None and not isinstance(per_family, dict):
        raise InputError(f"per_family must be a dict of family -> parameters, got {type(per_family).__name__}")
    reps = streams_per_family(profile)
    fams = pick(profile, smoke=FAMILIES[:2], quick=FAMILIES, full=FAMILIES)
    return [dict(base, family=f, rep=i, sweep="power", **real_params(f, profile), **(per_family or {}).get(f, {}))
            for f in fams for i in range(reps)]


def real_params(family: str, profile: str) -> dict:
    """A real family's head dimension and, on smoke and quick, the few layers its streams sample (loading a layer
    costs more than a stream); on full every layer. Not a real family: {}."""
    check_choice(profile, "profile", PROFILE_NAMES)
    if not isinstance(family, str):
        raise InputError(f"family must be a string, got {family!r}")
    if family not in REAL:
        return {}
    few = {"real SmolLM2": (2, 14, 27), "real MiniLM": (0, 3, 5)}[family]
    return dict(d={"real SmolLM2": 64, "real MiniLM": 32}[family],
                **({} if profile in ("full", "gpu") else {"layers": few}))


@functools.lru_cache(maxsize=8)
def _layer(model: str, layer: int, n: int):
    from kvbounds.traces.real import layer_heads
    Q, K, V, _ = layer_heads(f"{model}:L{layer}:{n}")
    return Q, K, V


def real_stream(family: str, rng: np.random.Generator, n: int, layers=None):
    """(Q, K, V, note) of one random (layer, head, window) of the family's model, or raise ``LookupError`` with
    the reason when the model is unavailable here. ``n`` in [1, the cached length]; ``layers``: None (any layer)
    or a non-empty sequence of the model's layer indices."""
    from kvbounds.traces.real import MODEL_INFO, available
    check_choice(family, "family", tuple(REAL))
    model, n_cached = REAL[family]
    check_rng(rng)
    check_int(n, "n", minimum=1, maximum=n_cached)
    n_layers = MODEL_INFO[model]["n_layers"]
    if layers is not None and (isinstance(layers, (str, bytes)) or not hasattr(layers, "__len__") or not len(layers)
                               or not all(isinstance(l, (int, np.integer)) and not isinstance(l, bool)
                                          and 0 <= l < n_layers for l in layers)):
        raise InputError(f"layers must be None or a non-empty sequence of layer indices in [0, {n_layers}), "
                         f"got {layers!r}")
    why = available(model)
    if why:
        raise LookupError(why)
    info = MODEL_INFO[model]
    layer = int(rng.choice(layers)) if layers else int(rng.integers(info["n_layers"]))
    head = int(rng.integers(info["n_heads"]))
    Q, K, V = _layer(model, layer, n_cached)
    start = int(rng.integers(0, n_cached - n + 1))
    sl = slice(start, start + n)
    return Q[head, sl], K[head, sl], V[head, sl], f"{model} L{layer} H{head} tokens {start}..{start + n - 1}"


def concentrated_stream(rng: np.random.Generator, n: int, d: int, scale: float, clusters: int = 4):
    """Keys in ``clusters`` tight clusters (radius 0.05) of norm r and ``HEAVY`` heavy tokens in the first tenth of
    the stream; each query is a heavy key's direction, orthogonal to every cluster centre, so its logit is GAP and
    a cluster key's is only the clusters' noise along it (about 0.05 GAP / sqrt(d) per key). The centres must leave
    a direction orthogonal to all of them: at d <= ``clusters`` the stream has d - 1 clusters; d = 1 (no such
    direction) and n < HEAVY are InputErrors."""
    check_rng(rng)
    n, d = check_int(n, "n", minimum=HEAVY, maximum=MAX_TOKENS), check_int(d, "d", minimum=2, maximum=MAX_DIM)
    scale = check_real(scale, "scale", minimum=0.0, strict=True)
    clusters = min(check_int(clusters, "clusters", minimum=1), d - 1)
    r = math.sqrt(GAP / scale)             # heavy logit r^2 scale; queries are orthogonal to the centres
    if not math.isfinite(r * r):
        raise InputError(f"scale = {scale!r} is too small: the heavy keys' norm sqrt(GAP / scale) overflows")
    centres = unit_directions(rng, clusters, d)
    lab = rng.integers(0, clusters, n)
    K = centres[lab] + 0.05 * rng.standard_normal((n, d)) / math.sqrt(d)
    heavy_dirs = unit_directions(rng, HEAVY, d)
    heavy_dirs -= (heavy_dirs @ centres.T) @ np.linalg.pinv(centres.T)     # orthogonal to the cluster centres
    heavy_dirs /= np.linalg.norm(heavy_dirs, axis=1, keepdims=True)
    pos = rng.choice(max(n // 10, HEAVY), HEAVY, replace=False)
    K[pos] = heavy_dirs
    K = K / np.linalg.norm(K, axis=1, keepdims=True) * r
    which = rng.integers(0, HEAVY, n)
    Q = heavy_dirs[which] * r
    return Q, K, r


def stream(params: dict, seed: int, *, scale_of_d, values: str = "gaussian", dv: int | None = None):
    """(Q, K, V, r, note) for a power trial; ``scale_of_d(d)`` is the claim's logit scale. Raises
    ``LookupError`` (the reason) when a real family's model is missing. ``params``: ``family`` (one of FAMILIES),
    ``n`` and ``d`` (integers >= 1; n >= HEAVY and d >= 2 for the concentrated family), optional ``r`` (> 0) and
    ``layers``; ``values``: "gaussian" or "spread"."""
    if not isinstance(params, dict) or not {"family", "n", "d"} <= params.keys():
        raise InputError(f"params must be a dict with 'family', 'n' and 'd', got {params!r}"[:200])
    check_choice(params["family"], "params['family']", FAMILIES)
    check_choice(values, "values", ("gaussian", "spread"))
    if not callable(scale_of_d):
        raise InputError("scale_of_d must be a function of d (the claim's logit scale)")
    seed = check_int(seed, "seed", minimum=0)
    fam = params["family"]
    n = check_int(params["n"], "params['n']", minimum=1, maximum=MAX_TOKENS)
    d = check_int(params["d"], "params['d']", minimum=1, maximum=MAX_DIM)
    dv = d if dv is None else check_int(dv, "dv", minimum=1, maximum=MAX_DIM)
    rng = np.random.default_rng(seed)
    if fam in REAL:
        Q, K, V, note = real_stream(fam, rng, n, params.get("layers"))
        d_real = K.shape[1]
        if scale_of_d(d_real) == 1.0:      # SubGen's exp(<q, k>): q / sqrt(d) gives the model's attention
            Q = Q / math.sqrt(d_real)
        r = float(max(np.linalg.norm(K, axis=1).max(), np.linalg.norm(Q, axis=1).max()))
        return Q, K, V, r, note
    if fam == "concentrated":
        Q, K, r = concentrated_stream(rng, n, d, scale_of_d(d))
        note = f"{HEAVY} heavy tokens, logit gap about {GAP:g} (less the clusters' noise along the query)"
    elif fam == "synthetic benign" and params.get("benign") == "clustered":     # SubGen's own regime
        from kvbounds.traces.synthetic import make_trace
        tr = make_trace("clustered", n=n, d=d, seed=rng, m=params.get("m", 4), r=1.0, spread=0.05)
        return tr.Q, tr.K, tr.V, float(max(np.linalg.norm(tr.K, axis=1).max(), np.linalg.norm(tr.Q, axis=1).max())), \
            f"clusterable keys (m = {params.get('m', 4)}, spread 0.05), r = 1"
    elif fam == "synthetic benign":
        r = check_real(params.get("r", 1.0), "params['r']", minimum=0.0, strict=True)
        Q, K = unit_directions(rng, n, d) * r, unit_directions(rng, n, d) * r
        note = f"random unit keys and queries, r = {r:g}"
    else:
        raise ValueError(f"unknown stream family {fam!r}; one of {FAMILIES}")
    if values == "spread":
        V = unit_directions(rng, n, dv) * (10.0 ** rng.uniform(-6, 0, n))[:, None]
    else:
        V = rng.standard_normal((n, dv)) / math.sqrt(dv)
    return Q, K, V, float(r), note


def missing_record(claim: str, params: dict, source: str, error: Exception, **extra):
    """The record of a power trial whose stream could not be built (a real trace missing): no measurement, the
    reason in ``extra["missing"]``, reported by the verdict as not run."""
    _record_fields(claim, params, source)
    return make_record(claim, params, measured=math.nan, bound=math.nan, holds=True, bound_kind="shape",
                       check=POWER_CHECK, source=source, missing=str(error), **extra)


def power_record(claim: str, params: dict, source: str, measured: float, controls: dict, **extra):
    """The method's error on one stream beside each trivial estimator's (``extra["controls"]``, same metric); the
    record's bound is the best control's, so ``holds`` reads "beat every control on this stream". A control whose
    value is None could not run (its reason in ``extra["controls_missing"]``): it is left out of the best; when no
    control ran (none, or all None) the bound is NaN and ``holds`` True (nothing to beat), said in
    ``extra["no_control"]``. A NaN error (the method's or a control's) is an InputError naming it."""
    _record_fields(claim, params, source)
    if not isinstance(controls, dict):
        raise InputError(f"controls must be a dict of control name -> error (or None), got {type(controls).__name__}")
    measured = check_error(measured, "the method's error (measured)")
    ran = {name: check_error(v, f"the error of control {name!r}") for name, v in controls.items() if v is not None}
    if not ran:
        extra.setdefault("no_control", "no trivial control could run on this stream" if controls else
                         "no trivial control recorded for this stream")
        return make_record(claim, params, measured=measured, bound=math.nan, holds=True, bound_kind="shape",
                           check=POWER_CHECK, source=source, controls=controls, **extra)
    best = min(ran.values())
    return make_record(claim, params, measured=measured, bound=best, holds=measured < best, bound_kind="shape",
                       check=POWER_CHECK, source=source, controls=controls, **extra)


# ------------------------------------------------------------------ the battery along a stream
class StreamBattery:
    """The battery's controls (:mod:`kvbounds.battery`) along one stream: at each checkpoint, every control of the
    prefix at the floats the method holds then, its error in the claim's metric (the worst over checkpoints is
    kept, as the method's eps_hat is), and the floats each control held at the last checkpoint. ``sink`` /
    ``window``: the method's own exact tokens (0: none; StreamingLLM then keeps 4 sink tokens). The ablation's
    error (the method with its ingredient replaced by chance, run by the check beside the method) is added with
    :meth:`add`."""

    def __init__(self, rng: np.random.Generator, *, sink: int = 0, window: int = 0,
                 names=("zeros", "mean", "streaming_llm", "uniform")):
        from kvbounds.battery import WorstError
        self.rng, self.sink, self.window, self.names = check_rng(rng), sink, window, tuple(names)
        self.worst, self.floats = WorstError(), {}

    def caches(self, K, V, floats: int) -> dict:
        from kvbounds import battery
        cs = battery.controls(K, V, check_int(floats, "floats"), self.rng, sink=self.sink, window=self.window,
                              names=self.names)
        self.floats = {n: battery.cache_floats(c) for n, c in cs.items()}
        return cs

    def attention(self, q, K, V, floats: int, scale: float, exact, unit: float) -> None:
        """Each control's ||attention - exact|| / unit at this checkpoint."""
        from kvbounds import battery
        for n, c in self.caches(K, V, floats).items():
            self.add(n, float(np.linalg.norm(battery.attention(c, q, scale) - exact)) / unit)

    def numerator(self, q, K, V, floats: int, scale: float, m_x: float, u_x, unit: float) -> None:
        """Each control's ||e^m u - e^{m_x} u_x|| e^{-m_x} / unit for the unnormalised sum (numerator) at this
        checkpoint (``unit`` in units of e^{m_x})."""
        from kvbounds import battery
        for n, c in self.caches(K, V, floats).items():
            m, u = battery.numerator(c, q, scale)
            with np.errstate(over="ignore", invalid="ignore"):      # an overflow is an infinite error: the worst
                est = np.zeros_like(u_x) if m == -math.inf else np.exp(m - m_x) * u
                self.add(n, float(np.linalg.norm(est - u_x)) / unit)

    def partition(self, q, K, floats: int, scale: float, log_z: float) -> None:
        """Each control's |tau / Z - 1| for the partition function Z = sum_i e^{<q, k_i> scale} (``log_z`` its
        log), keys only (no value floats)."""
        from kvbounds import battery
        for n, c in self.caches(K, K[:, :0], floats).items():
            with np.errstate(over="ignore"):                        # an overflow is an infinite error: the worst
                self.add(n, abs(float(np.expm1(float(battery.log_partition(c, q, scale)) - log_z))))

    def add(self, name: str, error: float) -> None:
        self.worst.add(name, error)

    def values(self) -> dict:
        return self.worst.values()


def battery_record(claim: str, params: dict, source: str, measured: float, controls: dict, *, method_floats: int,
                   stream_floats: int, controls_floats: dict | None = None, **extra):
    """:func:`power_record` with the battery's memory fields: ``extra["floats"]`` (the method's floats, the whole
    stream's, their ratio and each control's) and, when the method holds at least the whole stream's floats,
    ``extra["not_tested"]`` ("does not compress: X floats for Y"): such a stream is no test (every control at that
    memory is exact) and the power rule leaves it out, saying so."""
    from kvbounds import battery
    extra["floats"] = battery.floats_record(method_floats, stream_floats, controls_floats)
    why = battery.compression_problem(method_floats, stream_floats)
    if why:
        extra["not_tested"] = why
    return power_record(claim, params, source, measured, controls, **extra)
