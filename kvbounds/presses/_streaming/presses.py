"""The two streaming presses: BalanceKV's merge-and-reduce and SubGen's clusters and samples, each with its own
error bar (:mod:`kvbounds.presses._streaming.press` says how a press keeps the cache;
:mod:`kvbounds.presses._streaming.certificate`
what an error bar is)."""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np
import torch

from kvbounds.algorithms.validation import InputError

from . import balance
from .certificate import ErrorBar, capped, trivial_bar
from .press import StreamingPress, log_weights, weighted_output
from .subgen import SubGenState


def _layer_rows(press, layer_idx: int, b: int, Hkv: int) -> slice:
    return slice(layer_idx * b * Hkv, (layer_idx + 1) * b * Hkv)


def _seen_vmax(press, layer_idx, layer) -> torch.Tensor:
    """(b, Hkv) the largest value norm the layer has seen: absorbed into the middle or still stored."""
    stored = layer.values.double().norm(dim=-1).max(-1).values
    return stored if press._vmax is None else torch.maximum(press._vmax[layer_idx], stored)


def _exact_logz(press, layer, lg) -> torch.Tensor:
    """log of the exact part's mass (sink and recent tokens, weight 1 or padding) at logits lg (b, Hkv, r, S)."""
    a = log_weights(layer)[1].double()[:, :, None]
    s, mid = press.sink, press._mid
    exact = torch.ones(lg.shape[-1], dtype=torch.bool)
    exact[s:s + mid] = False
    return torch.logsumexp((lg + a)[..., exact], -1)


@dataclasses.dataclass
class StreamingBalanceKVPress(StreamingPress):
    """BalanceKV as a stream (BalanceKV-NeurIPS Thm 3.1, Alg. 1 with Alg. 4's merge-and-reduce and Alg. 2's
    self-balancing walk; :mod:`kvbounds.presses._streaming.balance` says which step each part is and where it differs).

    Error bars (:mod:`kvbounds.presses._streaming.certificate`): its certificate is a bound (deterministic, given the
    stored
    state): the walk's Cauchy-Schwarz sums (:class:`~kvbounds.presses._streaming.balance.WalkSums`) at the query,
    ||o_hat - o|| <= e^{||q||^2 scale / 2} (X_num + ||o_hat|| X_den) / Z_lo with Z_lo <= the exact denominator
    (the larger of Z_hat minus the denominator's error bound and the exact sink and recent tokens' mass), capped by
    the trivial bar ||o_hat|| + R. Vacuous when e^{(||q||^2 + max||k||^2) scale / 2} dwarfs Z_hat, which real keys
    do. ``kind="estimate"``: 3 max(se_HT, se_CS) of the middle's sampling error from the kept tokens.

    ``signs``: ``"walk"`` (the self-balancing walk) or ``"random"`` (the ingredient ablation: fair coins on the
    walk's own uniforms, i.e. random halving with the same pairs, levels and weights)."""
    signs: str = "walk"
    name: ClassVar[str] = "BalanceKV (streaming)"
    certificate_kind: ClassVar[str] = "bound"

    def __post_init__(self):
        super().__post_init__()
        if self.signs not in balance.SIGNS:
            raise InputError(f"signs must be one of {balance.SIGNS}, got {self.signs!r}")

    def reset(self) -> None:
        super().reset()
        self._levels: list[int] = []
        self._cert = None

    @property
    def walk_sums(self):
        """The walk's own sums (:class:`~kvbounds.presses._streaming.balance.WalkSums`; None before the first
        reduction)."""
        return self._cert

    def _state(self) -> dict:
        return dict(super()._state(), levels=list(self._levels),
                    cert=None if self._cert is None else self._cert.copy())

    def _set_state(self, st: dict) -> None:
        super()._set_state(st)
        self._levels = list(st["levels"])
        self._cert = None if st["cert"] is None else st["cert"].copy()

    def _reduce_middle(self, Km, Vm, Am, Bm, Kx, Vx, Ax, Bx, *, scale, uniform):
        if self._cert is None:
            self._cert = balance.WalkSums((Km.shape[0],))
        K, V = torch.cat([Km, Kx], 1), torch.cat([Vm, Vx], 1)
        logw = torch.cat([Am, Ax], 1)
        levels = self._levels + [0] * Kx.shape[1]
        K, V, logw, self._levels = balance.reduce_middle(K, V, logw, levels, self.middle, sink=0, scale=scale,
                                                         uniform=uniform, cert=self._cert, signs=self.signs)
        return K, V, logw, None

    def _certificate(self, layer_idx, layer, q, scale, kind) -> ErrorBar:
        b, H, d = q.shape
        Hkv = layer.keys.shape[1]
        rep = H // Hkv
        out, logz, lg = weighted_output(layer, q, scale)
        triv = trivial_bar(out, _seen_vmax(self, layer_idx, layer).repeat_interleave(rep, 1))
        if self._cert is None:
            return ErrorBar(kind, torch.full((b, H), -math.inf, dtype=torch.float64), triv,
                            f"{'a bound' if kind == 'bound' else 'an estimate'}: 0, the cache is exact (no reduction "
                            "yet)")
        if kind == "estimate":
            return self._estimate(layer, out, logz, lg, triv)
        sl = _layer_rows(self, layer_idx, b, Hkv)
        ln = self._cert.log_num[sl].reshape(b, Hkv).repeat_interleave(rep, 1)
        ld = self._cert.log_den[sl].reshape(b, Hkv).repeat_interleave(rep, 1)
        half_q = (q.double() ** 2).sum(-1) * scale / 2
        if not bool(torch.isfinite(half_q).all()):
            raise InputError("||q||^2 scale overflows float64: q or scale too large")
        log_xn, log_xd = ln + half_q, ld + half_q
        log_ze = _exact_logz(self, layer, lg).reshape(b, H)
        gap = (log_xd - logz).clamp_max(0.0)
        log_lo = torch.where(log_xd < logz, logz + torch.log1p(-torch.exp(gap)).nan_to_num(-math.inf), -math.inf)
        log_lo = torch.maximum(log_lo, log_ze)
        log_err = torch.logaddexp(log_xn, torch.log(out.norm(dim=-1)) + log_xd)
        what = ("a bound: the walk's Cauchy-Schwarz sums at the query, e^{||q||^2 scale/2} (X_num + ||o_hat|| "
                "X_den) / Z_lo, capped by the trivial bar ||o_hat|| + max||v||")
        return capped("bound", log_err - log_lo, triv, what,
                      "e^{(||q||^2 + max||k||^2) scale/2} dwarfs the cache's denominator", empty=logz == -math.inf)

    def _estimate(self, layer, out, logz, lg, triv) -> ErrorBar:
        """3 max(se_HT, se_CS) / Z_hat (the module docstring of :mod:`kvbounds.presses._streaming.certificate` derives
        it)."""
        b, H, _ = out.shape
        Hkv = layer.keys.shape[1]
        s, mid = self.sink, self._mid
        a = log_weights(layer)[0].double()[:, :, s:s + mid]                       # (b, Hkv, m)
        lm = lg[..., s:s + mid]                                                    # (b, Hkv, r, m)
        o = out.reshape(b, Hkv, H // Hkv, 1, -1)
        vals = layer.values[:, :, s:s + mid].double()[:, :, None]                  # (b, Hkv, 1, m, e)
        live = torch.isfinite(a)[:, :, None]
        lz = logz.reshape(b, Hkv, -1, 1)
        y = torch.exp(lm - torch.where(lz == -math.inf, 0.0, lz))[..., None] * (vals - o)  # per unit weight, / Z_hat
        y = torch.where(live[..., None], y, 0.0)
        w = torch.exp(a)[:, :, None]
        ht = (w * (w - 1) * (y * y).sum(-1)).sum(-1)
        both = live[..., 1:] & live[..., :-1]
        dif = ((y[..., 1:, :] - y[..., :-1, :]) ** 2).sum(-1)
        cs = torch.where(both, 0.5 * torch.maximum(w[..., 1:], w[..., :-1]) ** 2 * dif, 0.0).sum(-1)
        log_bar = math.log(3.0) + 0.5 * torch.log(torch.maximum(ht, cs)).reshape(b, H)
        what = ("an estimate, not a bound: 3 max(se_HT, se_CS) of the middle's sampling error from the kept tokens "
                "(independent-sampling and neighbour-difference variance estimates)")
        return capped("estimate", log_bar, triv, what, "the kept tokens' spread is as large as the values' range",
                      empty=logz == -math.inf)


@dataclasses.dataclass
class StreamingSubGenPress(StreamingPress):
    """SubGen as a stream (SubGen Alg. 1, Thm 1; ClusterGen Thm 2.4; :mod:`kvbounds.presses._streaming.subgen`): the
    middle
    holds ``clusters`` centres' uniform samples (``per_cluster`` each; 0: half the middle over the clusters) for the
    denominator and l2 samples of the values for the numerator (the rest of the middle), split weights
    (log_w_num != log_w_den).

    Error bar: an estimate, not a bound: 3 (se_num + R_v se_den) / Z_hat, the sampling standard errors of the two
    sums from the slots themselves (sample variances), R_v the largest value norm seen, Z_hat the cache's
    denominator (3 standard errors: a normal-approximation 99.7% bar that the samples' own spread can understate)."""
    clusters: int = 8
    per_cluster: int = 0
    name: ClassVar[str] = "SubGen (streaming)"
    certificate_kind: ClassVar[str] = "estimate"

    def __post_init__(self):
        super().__post_init__()
        for nm, low in (("clusters", 1), ("per_cluster", 0)):
            v = getattr(self, nm)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise InputError(f"{nm} must be an integer >= {low}, got {v!r}")
            setattr(self, nm, int(v))
        if self.clusters >= self.middle:
            raise InputError(f"clusters = {self.clusters} must be less than the middle (target - sink - window = "
                             f"{self.middle}): each cluster needs a sample and the rest holds the value samples")
        t = self.per_cluster or max(1, (self.middle // 2) // self.clusters)
        if self.clusters * t >= self.middle:
            raise InputError(f"clusters * per_cluster = {self.clusters * t} must be less than the middle "
                             f"(target - sink - window = {self.middle}): the rest holds the value samples")
        self._t = t

    def reset(self) -> None:
        super().reset()
        self._state_sg = None

    @property
    def state(self):
        """SubGen's online state (:class:`~kvbounds.presses._streaming.subgen.SubGenState`; None before the first
        reduction)."""
        return self._state_sg

    def _state(self) -> dict:
        return dict(super()._state(), sg=None if self._state_sg is None else self._state_sg.copy())

    def _set_state(self, st: dict) -> None:
        super()._set_state(st)
        self._state_sg = None if st["sg"] is None else st["sg"].copy()

    def _reduce_middle(self, Km, Vm, Am, Bm, Kx, Vx, Ax, Bx, *, scale, uniform):
        B, d, e = Kx.shape[0], Kx.shape[-1], Vx.shape[-1]
        if self._state_sg is None:
            t = self._t
            self._state_sg = SubGenState(B, d, e, clusters=self.clusters, per_cluster=t,
                                         samples=self.middle - self.clusters * t)
            n = self._state_sg.slots
            Km, Vm = Kx.new_zeros(B, n, d), Vx.new_zeros(B, n, e)
        alive = torch.isfinite(Ax) | torch.isfinite(Bx)
        return self._state_sg.absorb(Km, Vm, Kx, Vx, alive, uniform)

    def _certificate(self, layer_idx, layer, q, scale, kind) -> ErrorBar:
        b, H, d = q.shape
        Hkv = layer.keys.shape[1]
        out, logz, lg = weighted_output(layer, q, scale)                     # lg (b, Hkv, rep, S)
        vmax = _seen_vmax(self, layer_idx, layer)
        triv = trivial_bar(out, vmax.repeat_interleave(H // Hkv, 1))
        if self._state_sg is None:
            return ErrorBar(kind, torch.full((b, H), -math.inf, dtype=torch.float64), triv,
                            f"{'a bound' if kind == 'bound' else 'an estimate'}: 0, the cache is exact (no reduction "
                            "yet)")
        if kind == "bound":
            return capped("bound", torch.log(triv), triv, "a bound: the trivial bar ||o_hat|| + max||v|| (SubGen's "
                          "state holds no bound of its own)", "SubGen's state gives no bound", empty=logz == -math.inf)
        s, n = self.sink, self._state_sg.slots
        view = _StateView(self._state_sg, _layer_rows(self, layer_idx, b, Hkv))
        Km = layer.keys[:, :, s:s + n].reshape(b * Hkv, n, d)
        Vm = layer.values[:, :, s:s + n].reshape(b * Hkv, n, -1)
        se_n, se_d, mx = view.standard_errors(Km, Vm, lg[..., s:s + n].reshape(b * Hkv, H // Hkv, n))
        x = se_n + vmax.reshape(b * Hkv, 1) * se_d
        empty = logz == -math.inf
        log_bar = (math.log(3.0) + torch.log(x) + mx.double()).reshape(b, H) - torch.where(empty, 0.0, logz)
        what = "an estimate, not a bound: 3 (se_num + R_v se_den) / Z_hat from the samples' own spread"
        return capped("estimate", log_bar, triv, what, "the samples' spread is as large as the values' range",
                      empty=empty)


class _StateView(SubGenState):
    """One layer's rows of a stacked :class:`SubGenState` (for :meth:`SubGenState.standard_errors`)."""

    def __init__(self, state: SubGenState, sl: slice):      # noqa: super().__init__ not called: a view
        self.m, self.t, self.s = state.m, state.t, state.s
        self.counts, self.W = state.counts[sl], state.W[sl]
