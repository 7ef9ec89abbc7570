"""KV streams for testing a compressor: one attention head's queries, keys and values, from a named family.

A :class:`KVStream` holds ``K`` (n, d), ``V`` (n, dv) and ``Q`` (n, d) float64 numpy arrays in the model's own
convention: the attention of query q over the keys is ``softmax(K q * scale) V`` with ``scale = 1/sqrt(d)``. Build
one with :func:`make_stream`; its ``repr`` is that call, so a failing input printed by a test can be rebuilt as is.

Families (:data:`FAMILIES`; the first four and the real ones are those ``kvbounds evaluate`` runs the battery on):
  * ``synthetic benign``   random unit-direction keys and queries, logits of size about 1: near-uniform attention,
                           where the mean of the values is almost exact (:mod:`kvbounds.streams`);
  * ``concentrated``       keys in a few tight clusters plus 4 heavy tokens early in the stream; every query points
                           at one heavy token (a logit gap of about 5): heavy hitters;
  * ``clustered``          keys near 8 centres (noise 0.05 of their norm), queries at random
                           (:func:`kvbounds.traces.synthetic.clustered`);
  * ``low rank``           keys and values in a random rank-4 subspace plus 1% noise
                           (:func:`kvbounds.traces.synthetic.low_rank`);
  * ``rope``               low-rank keys and queries rotated by RoPE at their positions (d even;
                           :func:`kvbounds.traces.rope.rope_trace`);
  * ``outlier channels``   Gaussian keys and queries whose first two channels are sqrt(2 d) times larger than
                           the others (the "massive activations" of trained models): they carry the logits;
  * ``huge norms``         random directions of norm r with r^2 / sqrt(d) = 60 (SmolLM2's keys have 40-79): the
                           exp-kernel exp(<k_i, k_j> / sqrt(d)) is near-diagonal (its off-diagonal share is 2e-7
                           at d = 16, n = 256; not at d <= 4, where random directions come close), attention peaked;
  * ``duplicated keys``    every key drawn from a pool of n/8 distinct keys (exact repeats), values all distinct;
  * ``real SmolLM2`` / ``real MiniLM``  one (layer, head) of the model on the first n tokens of one distinct text of
                           :mod:`kvbounds.traces.corpus` (at most 1056 / 544; d is the model's, 64 / 32), the text
                           (``unit``) and the layer and head chosen by the seed
                           (:func:`kvbounds.streams.real_stream`); :func:`real_available` says why
                           a model is missing (its streams then raise ``LookupError``).

Every draw comes from ``numpy.random.default_rng(seed)``: the same (family, n, d, seed) gives the same stream.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from kvbounds.algorithms.validation import InputError, check_choice, check_int

from ._names import (BATTERY_FAMILIES, DRAWN_TEXTS, FAMILIES, MAX_DIM, MAX_TOKENS, REAL,  # noqa: F401 (re-exported)
                     REAL_DIM, REAL_TOKENS, SYNTHETIC)

HUGE_LOGIT = 60.0          # ||k||^2 / sqrt(d) of the "huge norms" family (SmolLM2's keys: 40-79)
OUTLIER_LOGIT = 2.0       # the logit share of the two outlier channels of the "outlier channels" family


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class KVStream:
    """One head's stream: ``Q`` (n, d), ``K`` (n, d), ``V`` (n, dv) float64, attention ``softmax(K q scale) V``."""
    family: str
    seed: int
    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    note: str = ""

    @property
    def n(self) -> int:
        return int(self.K.shape[0])

    @property
    def d(self) -> int:
        return int(self.K.shape[1])

    @property
    def dv(self) -> int:
        return int(self.V.shape[1])

    @property
    def scale(self) -> float:
        """The logit factor: 1 / sqrt(d)."""
        return 1.0 / math.sqrt(self.d)

    def __repr__(self) -> str:
        size = "" if self.family in REAL else f", d={self.d}"
        dv = "" if self.dv == self.d or self.family in REAL else f", dv={self.dv}"
        return f"make_stream({self.family!r}, n={self.n}{size}{dv}, seed={self.seed})"

    def _repr_pretty_(self, printer, cycle) -> None:
        """The same call in hypothesis's (and IPython's) pretty printer, which prints a dataclass field by field."""
        printer.text(repr(self))

    def describe(self) -> str:
        """The stream's call and what it holds (for an assertion's message)."""
        return f"{self!r}" + (f": {self.note}" if self.note else "")

    def attention(self, q: np.ndarray, upto: int | None = None) -> np.ndarray:
        """Exact ``softmax(K[:upto] q scale) V[:upto]`` for a query (d,) or queries (m, d), float64."""
        j = self.n if upto is None else check_int(upto, "upto", minimum=1, maximum=self.n)
        q = np.asarray(q, np.float64)
        x = q @ self.K[:j].T * self.scale
        w = np.exp(x - x.max(axis=-1, keepdims=True))
        return (w @ self.V[:j]) / w.sum(axis=-1, keepdims=True)

    def weights(self, q: np.ndarray, upto: int | None = None) -> np.ndarray:
        """The softmax weights of query q over the first ``upto`` keys (all by default)."""
        j = self.n if upto is None else check_int(upto, "upto", minimum=1, maximum=self.n)
        x = np.asarray(q, np.float64) @ self.K[:j].T * self.scale
        w = np.exp(x - x.max(axis=-1, keepdims=True))
        return w / w.sum(axis=-1, keepdims=True)

    def layer(self, dtype=np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(K, V, Q) as one layer of one KV head, (1, n, d) arrays: the method contract's shapes
        (:mod:`kvbounds.methods`)."""
        return tuple(np.ascontiguousarray(x[None], dtype=dtype) for x in (self.K, self.V, self.Q))


def real_available(family: str) -> str | None:
    """None when the real family's model and cached traces can be read here, else the reason."""
    check_choice(family, "family", REAL)
    from ._power import REAL as MODELS
    from kvbounds.traces.real import available
    return available(MODELS[family][0])


def _unit(rng, m, d):
    x = rng.standard_normal((m, d))
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def _values(rng, n, dv):
    return rng.standard_normal((n, dv)) / math.sqrt(dv)


def make_stream(family: str, n: int, d: int = 16, seed: int = 0, *, dv: int | None = None,
                unit: int | None = None) -> KVStream:
    """The stream of ``family`` (one of :data:`FAMILIES`) with ``n`` tokens of head dimension ``d`` (ignored by the
    real families: the model's) and value dimension ``dv`` (default d), drawn from ``seed``. A real family reads the
    first n tokens of one distinct text (:mod:`kvbounds.traces.corpus`): text number ``unit`` (distinct units read
    distinct texts; None: one of the first :data:`DRAWN_TEXTS`, drawn from ``seed``, so that tests reuse a few
    cached extractions), its layer and head drawn from ``seed``. Refused (InputError):
    an unknown family, n < 1 (n < 4 for ``concentrated``), d < 1 (d < 2 for ``concentrated``, odd d for ``rope``),
    a real family's n beyond its texts. A real family whose model is missing raises ``LookupError``."""
    check_choice(family, "family", FAMILIES)
    n = check_int(n, "n", minimum=1, maximum=MAX_TOKENS)
    d = check_int(d, "d", minimum=1, maximum=MAX_DIM)
    seed = check_int(seed, "seed", minimum=0, maximum=2**63 - 1)
    dv = d if dv is None else check_int(dv, "dv", minimum=1, maximum=MAX_DIM)
    rng = np.random.default_rng(seed)
    if family in REAL:
        from ._power import real_stream
        check_int(n, "n", minimum=1, maximum=REAL_TOKENS[family])
        unit = int(rng.integers(DRAWN_TEXTS)) if unit is None else check_int(unit, "unit", minimum=0)
        Q, K, V, note, _ = real_stream(family, rng, n, unit=unit)
        return KVStream(family, seed, *(np.asarray(x, np.float64) for x in (Q, K, V)), note=note)
    if family == "concentrated":
        from ._power import GAP, HEAVY, concentrated_stream
        check_int(n, "n (the concentrated family holds 4 heavy tokens)", minimum=HEAVY)
        check_int(d, "d (the concentrated family needs a direction orthogonal to its clusters)", minimum=2)
        Q, K, _ = concentrated_stream(rng, n, d, 1.0 / math.sqrt(d))
        return KVStream(family, seed, Q, K, _values(rng, n, dv),
                        note=f"{HEAVY} heavy tokens, logit gap about {GAP:g}")
    r = d ** 0.25                          # logits <q, k> / sqrt(d) of size about 1 for aligned directions
    if family == "synthetic benign":
        Q, K = _unit(rng, n, d) * r, _unit(rng, n, d) * r
        return KVStream(family, seed, Q, K, _values(rng, n, dv), note="random unit directions, logits <= 1")
    if family in ("clustered", "low rank"):
        from kvbounds.traces.synthetic import make_trace
        kw = dict(m=8, spread=0.05) if family == "clustered" else dict(rank=min(4, d, dv), noise=0.01)
        tr = make_trace(family.replace(" ", "_"), n=n, d=d, s=dv, seed=rng, r=2 * r, **kw)
        return KVStream(family, seed, tr.Q, tr.K, tr.V, note=", ".join(f"{k} {v:g}" for k, v in kw.items()))
    if family == "rope":
        if d % 2:
            raise InputError(f"the rope family needs an even head dimension, got d = {d}")
        from kvbounds.traces.rope import rope_trace
        tr = rope_trace(n, d, dv, rank=min(8, d, dv), r=2 * r, seed=rng)
        return KVStream(family, seed, tr.Q, tr.K, tr.V, note="rank-8 keys rotated by RoPE (theta 1e4)")
    if family == "outlier channels":
        Q, K = (rng.standard_normal((n, d)) * (r / math.sqrt(d)) for _ in range(2))
        for X in (Q, K):            # channels 0-1 carry logits of about OUTLIER_LOGIT; the others about 1 / sqrt(d)
            X[:, :2] *= math.sqrt(OUTLIER_LOGIT * d)      # entries sqrt(L) d^(1/4): logits L z z'
        return KVStream(family, seed, Q, K, _values(rng, n, dv),
                        note=f"channels 0-1 {math.sqrt(OUTLIER_LOGIT * d):.3g}x the others")
    if family == "huge norms":
        big = math.sqrt(HUGE_LOGIT * math.sqrt(d))
        return KVStream(family, seed, _unit(rng, n, d) * big, _unit(rng, n, d) * big, _values(rng, n, dv),
                        note=f"||k||^2 / sqrt(d) = {HUGE_LOGIT:g}: a near-diagonal exp-kernel")
    pool = _unit(rng, max(1, n // 8), d) * 2 * r             # duplicated keys
    K = pool[rng.integers(0, len(pool), n)]
    return KVStream(family, seed, _unit(rng, n, d) * 2 * r, K, _values(rng, n, dv),
                    note=f"{len(pool)} distinct keys, each repeated")
