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
                           first tokens of one distinct text (:mod:`kvbounds.traces.corpus`): stream ``rep`` reads
                           text ``rep``, so distinct streams are distinct texts (the unit of replication); the layer
                           (of :data:`REAL_LAYERS`) and head are drawn from its seed. A missing model gives a record
                           that says so (``extra["missing"]``), never a crash.

Each stream (:class:`PowerStream`) is the context (Q, K, V) of n tokens with r the largest key or query norm, the
:data:`HELD_OUT` later queries that follow it (the practitioner's metric: they attend to the compressed context),
and its unit; queries are in the claim's own convention: ``scale`` is the factor of <q, k> inside the exponential
(1/sqrt(d) for BalanceKV, 1 for SubGen, whose real-trace queries are divided by sqrt(d) so that exp(<q', k>) is the
model's attention).

The practitioner's metric (:func:`held_out_errors`): after the method has compressed the n tokens, the mean over the
later queries of ||estimate - exact|| / ||exact|| (attention: the claims' output; for the claims that bound a sum,
its numerator or partition function), for the method and for each control of the battery built at the floats the
method holds; it decides every "better than StreamingLLM / uniform" statement. The theorem's metric (the worst
checkpoint of the current query, in the theorem's units) decides the bound checks.
"""
from __future__ import annotations

import dataclasses
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
    """A real family's head dimension and the layers its streams sample (:data:`REAL_LAYERS`: a few on smoke and
    quick, more on full; extracting a layer costs more than a stream). Not a real family: {}."""
    check_choice(profile, "profile", PROFILE_NAMES)
    if not isinstance(family, str):
        raise InputError(f"family must be a string, got {family!r}")
    if family not in REAL:
        return {}
    return dict(d={"real SmolLM2": 64, "real MiniLM": 32}[family],
                layers=REAL_LAYERS[family]["full" if profile in ("full", "gpu") else "quick"])


# the layers a real stream draws from (every profile extracts these for each text it reads)
REAL_LAYERS = {"real SmolLM2": {"quick": (2, 14, 27), "full": (2, 8, 14, 20, 27)},
               "real MiniLM": {"quick": (0, 3, 5), "full": (0, 1, 2, 3, 4, 5)}}
# a real stream reads the first n + held-out tokens of one distinct text (kvbounds.traces.corpus), extracted once at
# the smallest of these lengths that holds them (each text long enough under the model's tokenizer)
WINDOWS = (544, 1056)
HELD_OUT = 32           # held-out later queries of a power stream: the practitioner's metric


def window_for(tokens: int) -> int:
    """The extraction length that holds ``tokens`` tokens (:data:`WINDOWS`); InputError beyond the longest."""
    check_int(tokens, "tokens", minimum=1)
    for w in WINDOWS:
        if tokens <= w:
            return w
    raise InputError(f"a real stream reads at most {WINDOWS[-1]} tokens of one text, got {tokens}")


def real_texts(family: str, tokens: int) -> tuple[str, ...]:
    """The distinct texts a real family's streams read at this length (:func:`kvbounds.traces.corpus.long_enough`
    at :func:`window_for`): unit i reads text i."""
    from kvbounds.traces.corpus import long_enough
    check_choice(family, "family", tuple(REAL))
    return long_enough(REAL[family][0], window_for(tokens))


@functools.lru_cache(maxsize=8)
def _layer(model: str, layer: int, text: str, window: int, layers: tuple):
    """(Q, K, V) float64 (heads, window, d) of one layer of ``model`` on the corpus text ``text``
    (:func:`kvbounds.traces.corpus.layer_heads`), extracting ``layers`` together when missing."""
    from kvbounds.traces.corpus import layer_heads
    return layer_heads(model, layer, window, text, layers)[:3]


def real_stream(family: str, rng: np.random.Generator, n: int, layers=None, *, unit: int | None = None,
                held_out: int = 0):
    """(Q, K, V, note, text) of one (layer, query head) of the family's model on the first n + ``held_out`` tokens
    of one distinct text (:func:`real_texts`): text number ``unit`` (distinct units read distinct texts; None: a text
    drawn from ``rng``), the layer drawn from ``layers`` (None: any of the family's :data:`REAL_LAYERS`) and the head
    from ``rng``. Raises ``LookupError`` with the reason when the model is unavailable here, InputError for a unit
    beyond the corpus (the message says how many texts there are). ``note`` names the text, layer and head."""
    from kvbounds.traces.real import MODEL_INFO, available
    check_choice(family, "family", tuple(REAL))
    model = REAL[family][0]
    check_rng(rng)
    check_int(n, "n", minimum=1, maximum=WINDOWS[-1])
    held_out = check_int(held_out, "held_out", minimum=0)
    n_layers = MODEL_INFO[model]["n_layers"]
    if layers is not None and (isinstance(layers, (str, bytes)) or not hasattr(layers, "__len__") or not len(layers)
                               or not all(isinstance(l, (int, np.integer)) and not isinstance(l, bool)
                                          and 0 <= l < n_layers for l in layers)):
        raise InputError(f"layers must be None or a non-empty sequence of layer indices in [0, {n_layers}), "
                         f"got {layers!r}")
    window = window_for(n + held_out)
    why = available(model)
    if why:
        raise LookupError(why)
    names = real_texts(family, n + held_out)
    if unit is None:
        unit = int(rng.integers(len(names)))
    unit = check_int(unit, "unit", minimum=0)
    if unit >= len(names):
        raise InputError(f"{family} has {len(names)} distinct texts of {window} tokens; unit {unit} is beyond them")
    layers = tuple(int(l) for l in (layers or REAL_LAYERS[family]["full"]))
    layer = int(rng.choice(layers))
    head = int(rng.integers(MODEL_INFO[model]["n_heads"]))
    Q, K, V = _layer(model, layer, names[unit], window, layers)
    sl = slice(0, n + held_out)
    return Q[head, sl], K[head, sl], V[head, sl], f"{model} {names[unit]} L{layer} H{head} tokens 0..{n - 1}", \
        names[unit]


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


@dataclasses.dataclass
class PowerStream:
    """A power trial's stream: the context (Q, K, V: the first n tokens, which the method compresses), r the largest
    key or query norm over it, ``later`` the ``held_out`` queries that follow it (the practitioner's metric: they
    attend to the compressed context), ``unit`` the unit of replication it belongs to (a distinct text for a real
    family, a distinct draw otherwise) and ``note`` what it is."""
    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    r: float
    note: str
    later: np.ndarray
    unit: str


def stream(params: dict, seed: int, *, scale_of_d, values: str = "gaussian", dv: int | None = None,
           held_out: int = HELD_OUT) -> PowerStream:
    """The :class:`PowerStream` of a power trial; ``scale_of_d(d)`` is the claim's logit scale. Raises
    ``LookupError`` (the reason) when a real family's model is missing. ``params``: ``family`` (one of FAMILIES),
    ``n`` and ``d`` (integers >= 1; n >= HEAVY and d >= 2 for the concentrated family), ``rep`` (the stream's
    index: a real family's text), optional ``r`` (> 0) and ``layers``; ``values``: "gaussian" or "spread";
    ``held_out``: the later queries drawn beyond the n tokens (the stream is drawn with n + held_out tokens)."""
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
    m = check_int(held_out, "held_out", minimum=0, maximum=MAX_TOKENS)
    rep = check_int(params.get("rep", 0), "params['rep']", minimum=0)
    rng = np.random.default_rng(seed)
    norm = lambda X: float(np.linalg.norm(X[:n], axis=1).max())
    if fam in REAL:
        Q, K, V, note, text = real_stream(fam, rng, n, params.get("layers"), unit=rep, held_out=m)
        d_real = K.shape[1]
        if scale_of_d(d_real) == 1.0:      # SubGen's exp(<q, k>): q / sqrt(d) gives the model's attention
            Q = Q / math.sqrt(d_real)
        return PowerStream(Q[:n], K[:n], V[:n], max(norm(K), norm(Q)), note, Q[n:n + m], f"text {text}")
    unit = f"draw {fam} #{rep} (seed {seed})"
    if fam == "concentrated":
        Q, K, r = concentrated_stream(rng, n + m, d, scale_of_d(d))
        note = f"{HEAVY} heavy tokens, logit gap about {GAP:g} (less the clusters' noise along the query)"
    elif fam == "synthetic benign" and params.get("benign") == "clustered":     # SubGen's own regime
        from kvbounds.traces.synthetic import make_trace
        tr = make_trace("clustered", n=n + m, d=d, seed=rng, m=params.get("m", 4), r=1.0, spread=0.05)
        return PowerStream(tr.Q[:n], tr.K[:n], tr.V[:n], max(norm(tr.K), norm(tr.Q)),
                           f"clusterable keys (m = {params.get('m', 4)}, spread 0.05), r = 1", tr.Q[n:], unit)
    elif fam == "synthetic benign":
        r = check_real(params.get("r", 1.0), "params['r']", minimum=0.0, strict=True)
        Q, K = unit_directions(rng, n + m, d) * r, unit_directions(rng, n + m, d) * r
        note = f"random unit keys and queries, r = {r:g}"
    else:
        raise ValueError(f"unknown stream family {fam!r}; one of {FAMILIES}")
    if values == "spread":
        V = unit_directions(rng, n + m, dv) * (10.0 ** rng.uniform(-6, 0, n + m))[:, None]
    else:
        V = rng.standard_normal((n + m, dv)) / math.sqrt(dv)
    return PowerStream(Q[:n], K[:n], V[:n], float(r), note, Q[n:], unit)


# the practitioner's metric per quantity (kvbounds.power_calls.METRICS names it "practitioner")
PRACTITIONER = {"attention": "mean relative attention error over the held-out later queries",
                "numerator": "mean relative error of the numerator sum over the held-out later queries",
                "partition": "mean relative error of the partition function over the held-out later queries"}


def _relative(kind: str, est, exact) -> float:
    """mean over queries of the relative error of ``est`` against ``exact`` in the quantity's representation:
    attention (m, dv) outputs; numerator (log-scales (m,), vectors (m, dv)) with the sum e^scale vector; partition
    log Z (m,). inf where an estimate is undefined (the worst)."""
    from kvbounds.battery import relative_error
    if kind == "attention":
        return relative_error(np.asarray(est, np.float64), np.asarray(exact, np.float64))
    if kind == "partition":
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.abs(np.expm1(np.asarray(est, np.float64) - np.asarray(exact, np.float64)))
        return float(np.mean(np.where(np.isfinite(e), e, math.inf)))
    (m, u), (mx, ux) = est, exact
    with np.errstate(over="ignore", invalid="ignore"):
        shift = np.where(np.asarray(m) == -math.inf, -math.inf, np.asarray(m, np.float64) - np.asarray(mx))
        diff = np.exp(shift)[:, None] * np.asarray(u, np.float64) - np.asarray(ux, np.float64)
        rel = np.linalg.norm(np.where(np.isfinite(diff), diff, math.inf), axis=-1) / np.linalg.norm(ux, axis=-1)
    return float(np.mean(np.where(np.isnan(rel), math.inf, rel)))


def held_out_errors(kind: str, method_estimate, K, V, later, floats: int, rng: np.random.Generator, *, scale: float,
                    sink: int = 0, window: int = 0, ablation_estimate=None,
                    names=("zeros", "mean", "streaming_llm", "uniform")) -> dict:
    """The practitioner's metric of one stream (``extra["practitioner"]`` of its power record): after the method
    compressed the context K, V (n tokens), the mean over the ``later`` queries (m, d) of the relative error of its
    ``kind`` (attention, numerator or partition: :data:`PRACTITIONER`) against the exact one over the context, for
    the method (``method_estimate(later)`` in the quantity's representation, :func:`_relative`), each control of
    the battery at ``floats`` (the floats the method holds at the end, the same sink and window) and the ablation
    (``ablation_estimate``, when given). Returns {metric, kind, queries, method, controls, floats}."""
    from kvbounds import battery
    check_choice(kind, "kind", tuple(PRACTITIONER))
    later = np.asarray(later, np.float64)
    if later.ndim != 2 or len(later) == 0:
        raise InputError(f"later must be a (m >= 1, d) array of queries, got shape {later.shape}")
    K, V = np.asarray(K, np.float64), np.asarray(V, np.float64)
    Vk = K[:, :0] if kind == "partition" else V
    caches = battery.controls(K, Vk, check_int(floats, "floats"), rng, sink=sink, window=window, names=names)
    x = later @ K.T * scale
    mx = x.max(-1)
    w = np.exp(x - mx[:, None])
    exact = {"attention": (w @ V) / w.sum(-1, keepdims=True), "numerator": (mx, w @ V),
             "partition": mx + np.log(w.sum(-1))}[kind]
    of = {"attention": lambda c: battery.attention(c, later, scale), "numerator": lambda c: battery.numerator(c, later, scale),
          "partition": lambda c: battery.log_partition(c, later, scale)}[kind]
    controls = {name: _relative(kind, of(c), exact) for name, c in caches.items()}
    if ablation_estimate is not None:
        controls["ablation"] = _relative(kind, ablation_estimate(later), exact)
    return dict(metric=PRACTITIONER[kind], kind=kind, queries=int(len(later)),
                method=_relative(kind, method_estimate(later), exact), controls=controls,
                floats={name: battery.cache_floats(c) for name, c in caches.items()})


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
