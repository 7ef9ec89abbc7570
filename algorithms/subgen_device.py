"""SubGen's update (SubGen Alg. 1 lines 4-6, 11-28; ClusterGen Alg. 1) with its state on the device: no host read
per token on torch/cupy (issue 15; arXiv 2402.06082, claims SG.*). The host path of
:class:`kvbounds.algorithms.subgen.SubGen` reads four values per token (||k||^2, ||v||^2, the nearest cluster and
its distance) and copies two coin masks to the device; on a GPU each of those waits for the device. Here:

* the counters live on the device: m' (number of clusters), n_i, mu. The representatives' buffer has more rows
  than m'; rows >= m' are masked (+inf distance), and the token is written at row ``r = joined ? i* : m'`` with
  ``xp.where`` choosing between the two branches of line 13 (both are cheap). m' is read only when the buffer may
  be full (m' <= m' at the last read + tokens since), or when a query needs it;
* the coins: the uniforms of many tokens are drawn at once on the host (the same numpy ``Generator``, hence
  the same sequence: a token takes R t uniforms when it joins a cluster, then R s) and copied to the device in one
  transfer; an offset on the device says where the next token's coins start. The offset is read when the block may
  run out. A Generator passed by the caller is rewound after each public call to just after the uniforms used, so
  it stands where the host path leaves it;
* the checks that read values (squared norms finite; the estimate's overflow) are one read per ``update`` or
  ``query`` call, and one per ``update_many`` / ``stream`` call (flags accumulated on the device).

Same states and outputs, bit for bit, as the host path on the same backend: the same floats decide the same
comparisons (distances compared with delta in float64, p = ||v||^2 / (mu + ||v||^2) in float64, log n_i/t and
log ||v||^2 in float64 and rounded to the state's dtype, as Python floats assigned to the arrays were).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.gpu.backend import device as _dev, to_numpy

from .host_values import _host_floats
from .validation import InputError

COIN_BLOCK_TOKENS = 64        # uniforms drawn per host transfer: this many tokens' worth (at most 2^20 doubles)


class _DeviceStream:
    """Mixin of :class:`kvbounds.algorithms.subgen.SubGen`: the device-resident state and update (module docstring)."""

    def _device_allocate(self, xp, k) -> None:
        dev, R, cap = _dev(k), self.R, self._X.shape[0]
        i64 = xp.int64
        self._m_dev = xp.zeros((1,), dtype=i64, device=dev)        # m', shape (1,): usable as an index array
        self._m_known, self._since = 0, 0                          # m' at the last read; tokens since then
        self._counts = xp.zeros((cap,), dtype=i64, device=dev)
        self._rep_index = xp.zeros((cap,), dtype=i64, device=dev)
        self._mu_dev = xp.zeros((), dtype=xp.float64, device=dev)
        self._U = xp.zeros((0,), dtype=xp.float64, device=dev)      # uniforms not yet known to be used
        self._u_off = xp.zeros((1,), dtype=i64, device=dev)        # next coin's index in _U
        self._off_bound = 0                                        # upper bound of _u_off known on the host
        self._drawn, self._rng_saved = 0, None                     # for rewinding a caller's Generator
        self._per_token = R * (self.t + self.s)
        self._mu_host = 0.0                                        # mu on the host, None when it changed since

    # -- host reads ---------------------------------------------------------------------------------------
    def _read_counters(self) -> None:
        """m' and the coin offset, in one read."""
        m, off = _host_floats(self._xp, self._m_dev[0], self._u_off[0])
        self._m_known, self._since, self._off_bound = int(m), 0, int(off)

    def _device_m(self) -> int:
        if self._since:
            self._read_counters()
        return self._m_known

    def _device_mu(self) -> float:
        if self._mu_host is None:
            self._mu_host = float(to_numpy(self._mu_dev))
        return self._mu_host

    def _prepare_token(self) -> None:
        """Room for one more cluster and one more token's coins, reading the counters only when in doubt."""
        xp = self._xp
        cap = self._X.shape[0]
        if self._m_known + self._since < cap and self._off_bound + self._per_token <= self._U.shape[0]:
            return
        self._read_counters()
        if 2 * self._m_known > cap:
            self._grow()
        off = self._off_bound
        if off + self._per_token > self._U.shape[0]:                # draw the next block of uniforms
            rng = self._coins.rng
            if not self._owns_rng and self._rng_saved is None:
                self._rng_saved, self._drawn = rng.bit_generator.state, 0
            size = max(self._per_token, min(COIN_BLOCK_TOKENS * self._per_token, 2**20))
            fresh = xp.asarray(rng.random(size), dtype=xp.float64, device=_dev(self._X))
            self._drawn += size
            self._U = xp.concat([self._U[off:], fresh])
            self._u_off = xp.zeros((1,), dtype=xp.int64, device=_dev(self._X))
            self._off_bound = 0

    def _settle_coins(self) -> None:
        """A caller's Generator: rewind it to just after the uniforms used (the host path's state)."""
        if self._owns_rng or self._rng_saved is None:
            return
        self._read_counters()
        used = self._drawn - (self._U.shape[0] - self._off_bound)
        rng = self._coins.rng
        rng.bit_generator.state = self._rng_saved
        rng.random(used)
        self._rng_saved, self._drawn = None, 0
        self._U = self._U[:0]
        self._u_off = self._u_off * 0
        self._off_bound = 0

    def _flag(self, name: str, bad) -> None:
        flags = self._flags if self._flags is not None else {}
        flags[name] = bad if name not in flags else flags[name] | bad
        self._flags = flags

    def _raise_flags(self) -> None:
        """The checks deferred by a batched call, in one read."""
        flags, self._flags = self._flags, None
        if not flags:
            return
        names = list(flags)
        for name, bad in zip(names, _host_floats(self._xp, *(flags[nm] for nm in names))):
            if bad:
                raise InputError(_MESSAGES[name].format(dtype=self._X.dtype))

    # -- update ---------------------------------------------------------------------------------------------
    def _device_update(self, xp, k, v, *, batched: bool) -> None:
        """Alg. 1 lines 4-6 for one token on the device."""
        k2, v2 = k @ k, v @ v
        if batched:                 # entries were checked finite by the caller; only the squares may overflow
            self._flag("k", ~xp.isfinite(k2))
            self._flag("v", ~xp.isfinite(v2))
        else:
            for name, x2 in zip(("k", "v"), _host_floats(xp, k2, v2)):
                if not math.isfinite(x2):
                    raise InputError(f"{name} contains NaN or Inf (or its squared norm overflows {k.dtype})")
        if self._X is None:
            self._allocate(k, v)
        self._prepare_token()
        w2 = xp.astype(k2 if self.reservoir_norm == "key" else v2, xp.float64)
        self._device_normalizer(xp, k)
        self._device_matrix_product(xp, k, v, w2)
        self._mu_dev = self._mu_dev + w2                                   # line 6
        self._mu_host = None
        self.n += 1
        self._since += 1
        self._off_bound += self._per_token

    def _device_normalizer(self, xp, k) -> None:
        """UpdateSoftmaxNormalizer (lines 11-23), both branches of line 13 written with xp.where."""
        j, R, t, dev = self.n, self.R, self.t, _dev(self._X)
        cap = self._X.shape[0]
        dist = xp.linalg.vector_norm(self._X - k, axis=-1)                  # line 12, every row of the buffer
        live = xp.arange(cap, device=dev) < self._m_dev
        dist = xp.where(live, dist, xp.full_like(dist, math.inf))
        i = xp.reshape(xp.argmin(dist), (1,))
        joined = xp.astype(xp.take(dist, i), xp.float64) <= self.delta     # line 13, (1,)
        r = xp.where(joined, i, self._m_dev)                               # the row this token updates
        c_new = xp.where(joined, xp.take(self._counts, r) + 1, xp.ones_like(r))
        self._counts[r] = c_new                                            # line 14 / line 21
        c64 = xp.astype(c_new, xp.float64)
        logc = xp.where(joined, xp.log(c64 / t), xp.full_like(c64, -math.log(t)))
        self._logc[r] = xp.astype(logc, self._logc.dtype)
        u = xp.reshape(xp.take(self._U, self._u_off + xp.arange(R * t, device=dev)), (R, t))
        slots = (u < 1.0 / c64) | ~joined                                 # lines 16-17; a new cluster: all t
        S_r, Sidx_r = xp.take(self._S, r, axis=0), xp.take(self._Sidx, r, axis=0)
        self._S[r] = xp.where(slots[None, :, :, None], k, S_r)
        self._Sidx[r] = xp.where(slots[None], xp.full_like(Sidx_r, j), Sidx_r)
        self._X[r] = xp.where(joined[:, None], xp.take(self._X, r, axis=0), k)   # line 20: x = k
        self._rep_index[r] = xp.where(joined, xp.take(self._rep_index, r), xp.full_like(r, j))
        self._m_dev = self._m_dev + xp.astype(~joined, xp.int64)
        self._u_off = self._u_off + xp.where(joined, xp.full_like(r, R * t), xp.zeros_like(r))
        if self.track:
            self._labels.append(r)

    def _device_matrix_product(self, xp, k, v, w2) -> None:
        """UpdateMatrixProduct (lines 24-28)."""
        R, s, dev = self.R, self.s, _dev(self._X)
        total = self._mu_dev + w2
        p = xp.where(total > 0, w2 / xp.where(total > 0, total, xp.ones_like(total)), xp.ones_like(total))
        u = xp.reshape(xp.take(self._U, self._u_off + xp.arange(R * s, device=dev)), (R, s))
        hit = u < p                                                        # line 26
        self._Mk = xp.where(hit[..., None], k, self._Mk)
        self._Mv = xp.where(hit[..., None], v, self._Mv)
        logw = xp.where(w2 > 0, xp.log(xp.where(w2 > 0, w2, xp.ones_like(w2))), xp.full_like(w2, math.inf))
        self._Mlogw = xp.where(hit, xp.astype(logw, self._Mlogw.dtype), self._Mlogw)
        self._Midx = xp.where(hit, xp.full_like(self._Midx, self.n), self._Midx)
        self._u_off = self._u_off + R * s


_MESSAGES = {"k": "a row of K contains NaN or Inf (or its squared norm overflows {dtype})",
             "v": "a row of V contains NaN or Inf (or its squared norm overflows {dtype})",
             "q": "a row of Q contains NaN or Inf",
             "overflow": "the estimate overflows: logits of M's keys exceed those of the cluster samples "
                         "by more than the float range"}
