"""The battery on KV streams for ``kvbounds evaluate``: one trial per (stream family, stream), one record per memory
fraction, in the representation every power cell of the package reads (:mod:`kvbounds.battery`).

The protocol (:func:`run_trial`): a stream of n + m tokens of one head (:func:`kvbounds.streams.make_stream`)
is cut into a context of n tokens, which the method compresses (a press reads the context's queries too, as inside
a prefill: SnapKV's observation window is the context's last queries), and the m queries that follow it, which the
cache answers. At each memory fraction f the method gets ``floor(f n (d + dv))`` floats per head and every control
of the battery (:func:`kvbounds.battery.run`: zeros, the mean, StreamingLLM with 4 sink tokens, a weighted uniform
sample, and the method's ablation where the registry names one) the floats the method's cache holds, counted the
same way for both (:func:`kvbounds.battery.cache_floats`). The metric, for the method and each control alike, is
the relative attention error over the m held-out queries:

    mean_q ||Attn_hat(q) - Attn(q)|| / ||Attn(q)||,   Attn(q) = softmax(K q / sqrt(d)) V over the context,

so that returning zeros scores exactly 1. A method that holds at least the whole context's floats is not tested
there (``extra["not_tested"]``: every control at that memory is exact).

Records: claim ``evaluate``, ``params`` with the SPEC, family, stream index and sizes, ``measured`` the method's
metric, ``extra["controls"]`` each control's, ``extra["floats"]`` the memory (:func:`kvbounds.battery.floats_record`)
and ``extra["fraction"]`` the fraction asked.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.validation import InputError, check_choice
from kvbounds.battery import relative_error

CLAIM = "evaluate"
CHECK = "battery"
SOURCE = "kvbounds evaluate: the battery at equal memory"
PROFILES = ("smoke", "quick", "full")
# per profile: families, streams per family, context tokens, held-out queries, synthetic head dim, fractions
SETUP = {
    "smoke": dict(families=("synthetic benign", "concentrated"), streams=10, n=112, queries=16, d=32,
                  fractions=(0.25,)),
    "quick": dict(families=None, streams=20, n=480, queries=32, d=64, fractions=(0.1, 0.25, 0.5)),
    "full": dict(families=None, streams=40, n=992, queries=32, d=64, fractions=(0.05, 0.1, 0.25, 0.5)),
}
SINK_WINDOW = (4, 16)      # a contract compressor's exact first / last tokens (a press chooses its own: 0, 0)


def families(profile: str) -> tuple[str, ...]:
    from kvbounds.streams import BATTERY_FAMILIES
    check_choice(profile, "profile", PROFILES)
    return SETUP[profile]["families"] or BATTERY_FAMILIES


def fractions(profile: str, ratio: float | None = None) -> tuple[float, ...]:
    """The memory fractions of ``profile``, with 1 - ``ratio`` (the fraction a press at that compression ratio
    keeps) added when given."""
    check_choice(profile, "profile", PROFILES)
    fr = set(SETUP[profile]["fractions"])
    if ratio is not None:
        fr.add(round(1.0 - float(ratio), 6))
    return tuple(sorted(fr))


def stream_seed(seed: int, family: str, rep: int) -> int:
    """The seed of stream ``rep`` of ``family`` for the run seed ``seed``: the same streams for every SPEC, so two
    methods evaluated with the same seed meet the same streams."""
    import hashlib
    h = hashlib.sha256(f"{int(seed)}|{family}|{int(rep)}".encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


def trials(spec: str, profile: str, ratio: float | None = None, seed: int = 0) -> list[dict]:
    """One trial per (family, stream) of the profile: the params of :func:`run_trial`."""
    from kvbounds.streams import REAL_TOKENS
    s = SETUP[profile]
    out = []
    for fam in families(profile):
        n = min(s["n"], REAL_TOKENS.get(fam, s["n"] + s["queries"]) - s["queries"])
        for rep in range(s["streams"]):
            out.append(dict(spec=spec, family=fam, rep=rep, n=n, queries=s["queries"], d=s["d"],
                            fractions=list(fractions(profile, ratio)), stream_seed=stream_seed(seed, fam, rep)))
    return out


def in_canonical_order(c):
    """The cache with its tokens sorted (by key, then value, then weights): a cache is a set of weighted tokens, so
    two caches holding the same ones (a press returns them in its top-k order, a control in position order) give
    bit-identical estimates (the same sums in the same order), and are called tied without float noise."""
    from kvbounds.algorithms.compressed_kv import CompressedKV
    keys, values = np.asarray(c.keys), np.asarray(c.values)
    if keys.shape[-2] < 2:
        return c
    a, b = np.asarray(c.log_w_num), np.asarray(c.log_w_den)
    out = [np.empty_like(x) for x in (keys, values, a, b)]
    for h in np.ndindex(keys.shape[:-2]):
        cols = np.concatenate([keys[h], values[h], a[h][:, None], b[h][:, None]], axis=1)
        order = np.lexsort(cols.T[::-1])
        for o, x in zip(out, (keys, values, a, b)):
            o[h] = x[h][order]
    return CompressedKV(*out, extra_floats=c.extra_floats, rank=c.rank, projected=c.projected)


def stream_of(params: dict, seed: int):
    """The trial's stream: context (Q, K, V) of n tokens and the m queries that follow, as (K, V, Q_ctx, Q_eval,
    stream) with K, V, Q_ctx of shape (1, n, d) float64."""
    from kvbounds.streams import make_stream
    n, m = int(params["n"]), int(params["queries"])
    real = params["family"] in ("real SmolLM2", "real MiniLM")
    s = make_stream(params["family"], n + m, int(params["d"]), seed=seed % (2**63),
                    unit=int(params["rep"]) if real and "rep" in params else None)
    K, V, Q = (x[None, :n].astype(np.float64) for x in (s.K, s.V, s.Q))
    return K, V, Q, s.Q[n:n + m], s


def unit_of(params: dict, s) -> str:
    """A stream's unit of replication: a distinct text for a real family (its note names it), else the draw."""
    if params["family"] in ("real SmolLM2", "real MiniLM"):
        return "text " + s.note.split(" ")[1] if " " in s.note else f"text {params['rep']}"
    return f"draw {params['family']} #{params.get('rep', 0)}"


def run_trial(params: dict, seed: int = 0, backend: str = "numpy"):
    """The records of one stream: one per fraction (the module docstring). The stream and every draw come from
    ``params["stream_seed"]`` (the runner's trial ``seed`` is not used: it depends on the SPEC)."""
    from kvbounds import battery
    from kvbounds.core import make_record
    from ._spec import resolve
    if not isinstance(params, dict) or "spec" not in params:
        raise InputError("params must be a dict of an evaluate trial (spec, family, rep, n, queries, d, fractions)")
    spec = resolve(params["spec"])
    seed = int(params.get("stream_seed", seed))
    try:
        K, V, Q, q_eval, s = stream_of(params, seed)
    except LookupError as e:             # a real family whose model is missing here: no measurement, the reason
        return [make_record(CLAIM, dict(params, fraction=f), measured=math.nan, bound=math.nan, holds=True,
                            bound_kind="shape", check=CHECK, source=SOURCE, missing=str(e), family=params["family"])
                for f in params["fractions"]]
    n, d, dv = K.shape[-2], K.shape[-1], V.shape[-1]
    scale = 1.0 / math.sqrt(d)
    x = q_eval @ K[0].T * scale
    w = np.exp(x - x.max(-1, keepdims=True))
    exact = (w @ V[0]) / w.sum(-1, keepdims=True)
    sink, window = (0, 0) if spec.kind == "press" else SINK_WINDOW
    whole = battery.stream_floats(n, d, dv)
    out = []
    for i, f in enumerate(params["fractions"]):
        floats = int(math.floor(f * whole))
        rng = np.random.default_rng([seed % (2**63), i])
        caches = battery.run(spec.compress, K, V, floats, rng, sink=sink, window=window, Q=Q,
                             ablation=spec.ablation or None)
        c = in_canonical_order(caches.pop("method"))
        held = battery.cache_floats(c)
        est = {name: battery.attention(in_canonical_order(cache), q_eval, scale) for name, cache in caches.items()}
        metric = relative_error(battery.attention(c, q_eval, scale), exact)
        ctl = {name: relative_error(e, exact) for name, e in est.items()}
        floats_rec = battery.floats_record(held, whole, {k: battery.cache_floats(v) for k, v in caches.items()})
        extra = dict(controls=ctl, floats=floats_rec, fraction=f, family=params["family"], note=s.note,
                     kept=int(c.keys.shape[-2]), unit=unit_of(params, s))
        why = battery.compression_problem(held, whole)
        if why:
            extra["not_tested"] = why
        best = min(ctl.values())
        out.append(make_record(CLAIM, dict(params, fraction=f), measured=metric, bound=best, holds=metric < best,
                               bound_kind="shape", check=CHECK, source=SOURCE, **extra))
    return out


def compare_on_streams(method, control: str, streams, *, fraction: float = 0.25, queries: int | None = None,
                       alpha: float = 0.05) -> dict:
    """The battery's call of ``method`` against one ``control`` at equal memory on the given KV streams (the
    engine of :func:`kvbounds.testing.assert_beats`): each stream's last ``queries`` tokens (default
    n // 8, at least 1) are the held-out queries, the rest the context compressed at ``fraction`` of its floats;
    the metric is :func:`kvbounds.battery.relative_error`; the call is the power rule's over the streams as one setting.
    ``method``: a SPEC, a press or a compressor (:func:`kvbounds.evaluation.resolve_object`). Returns the
    call's dict (:class:`kvbounds.verdict.Call`) with ``method``, ``streams``, ``families``, ``detectable``
    and ``smallest_loss`` (the smallest stream, by n then d, on which the method's error was not below the
    control's; "" when none)."""
    from kvbounds import battery
    from kvbounds.algorithms.validation import check_int, check_probability
    from kvbounds.battery import power_vs_controls
    from ._spec import resolve_object
    from kvbounds.core import make_record
    from kvbounds.streams import KVStream
    check_choice(control, "control", tuple(c for c in battery.CONTROLS if c != "ablation"))
    check_probability(alpha, "alpha")
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction < 1:
        raise InputError(f"fraction must be a number in (0, 1), got {fraction!r}")
    if queries is not None:
        queries = check_int(queries, "queries (held-out queries per stream)", minimum=1)
    if isinstance(streams, (str, bytes, KVStream)) or not hasattr(streams, "__iter__"):
        raise InputError(f"streams must be a non-empty sequence of KVStream (kvbounds.testing.make_stream), got "
                         f"{type(streams).__name__}")
    streams = list(streams)
    if not streams or not all(isinstance(s, KVStream) for s in streams):
        raise InputError("streams must be a non-empty sequence of KVStream (kvbounds.testing.make_stream)")
    spec = resolve_object(method)
    sink, window = (0, 0) if spec.kind == "press" else SINK_WINDOW
    records, losses = [], []
    for i, s in enumerate(streams):
        m = max(1, s.n // 8) if queries is None else queries
        n = s.n - m
        if n < 2:
            raise InputError(f"queries: stream {s!r} is too short for {m} held-out queries (a context of at least 2 "
                             "tokens must remain)")
        K, V, Q = (x[None, :n] for x in (s.K, s.V, s.Q))
        q = s.Q[n:]
        x = q @ s.K[:n].T * s.scale
        w = np.exp(x - x.max(-1, keepdims=True))
        exact = (w @ s.V[:n]) / w.sum(-1, keepdims=True)
        whole = battery.stream_floats(n, s.d, s.dv)
        caches = battery.run(spec.compress, K, V, int(math.floor(fraction * whole)), np.random.default_rng([s.seed, i]),
                             sink=sink, window=window, Q=Q)
        c = in_canonical_order(caches["method"])
        held = battery.cache_floats(c)
        err = relative_error(battery.attention(c, q, s.scale), exact)
        ctl = relative_error(battery.attention(in_canonical_order(caches[control]), q, s.scale), exact)
        extra = dict(controls={control: ctl}, floats=battery.floats_record(held, whole), family=s.family)
        why = battery.compression_problem(held, whole)
        if why:
            extra["not_tested"] = why
        records.append(make_record(CLAIM, dict(stream=repr(s), i=i), measured=err, bound=ctl, holds=err < ctl,
                                   bound_kind="shape", check=CHECK, source=SOURCE, **extra))
        if not err < ctl:
            losses.append(s)
    power = power_vs_controls(records, setting=lambda r: "streams", alpha=alpha)
    (call,) = [c for c in power.calls if c["control"] == control]
    smallest = min(losses, key=lambda s: (s.n, s.d, s.seed), default=None)
    return dict(call, method=spec.name, streams=len(streams), families=sorted({s.family for s in streams}),
                smallest_loss=smallest.describe() if smallest else "")
