"""SubGen's update (SubGen Alg. 1 lines 4-6, 11-28; ClusterGen Alg. 1) with its state on the device: no host read
per token on torch/cupy (arXiv 2402.06082, claims SG.*). The host path of
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

from kvbounds.algorithms.arrays import array_namespace, device as _dev, to_numpy

from .host_values import host_floats
from .validation import InputError

__all__ = ["COIN_BLOCK_TOKENS", "DeviceStream"]

COIN_BLOCK_TOKENS = 64        # uniforms drawn per host transfer: this many tokens' worth (at most 2^20 doubles)


class DeviceStream:
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
        self._coins_t = xp.arange(R * self.t, device=dev)            # a token's cluster coins, from its offset
        self._coins_s = xp.arange(R * self.s, device=dev)            # and its matrix coins
        self._rows = xp.arange(cap, device=dev)
        self._mu_host = 0.0                                        # mu on the host, None when it changed since

    # -- host reads ---------------------------------------------------------------------------------------
    def _read_counters(self) -> None:
        """m' and the coin offset, in one read."""
        m, off = host_floats(self._xp, self._m_dev[0], self._u_off[0])
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
        for name, bad in zip(names, host_floats(self._xp, *(flags[nm] for nm in names))):
            if bad:
                raise InputError(_MESSAGES[name].format(dtype=self._X.dtype))

    def _batch(self, K, V, Q):
        """update_many / stream on the device: the checks of the whole call in one read up front (finite entries;
        squared norms that cannot overflow, else flagged per token and read at the end), no read per token
        except m' for each query."""
        xp = self._xp or array_namespace(K)
        arrays = [("K", K), ("V", V)] + ([("Q", Q)] if Q is not None else [])
        vals = host_floats(xp, *(xp.all(xp.isfinite(X)) for _, X in arrays), xp.max(xp.abs(K)), xp.max(xp.abs(V)))
        for (name, _), ok in zip(arrays, vals):
            if not ok:
                raise InputError(f"{name} contains NaN or Inf")
        limit = float(xp.finfo(K.dtype).max) / 4
        amax_k, amax_v = vals[len(arrays):]
        self._prechecked = amax_k * amax_k * K.shape[1] < limit and amax_v * amax_v * V.shape[1] < limit
        out = []
        try:
            for j in range(K.shape[0]):
                self._update(K[j], V[j], batched=True)
                if Q is not None:
                    out.append(self._device_query(Q[j], deferred=True))
        finally:
            self._prechecked = False
        self._raise_flags()
        self._settle_coins()
        return out

    # -- update ---------------------------------------------------------------------------------------------
    def _device_update(self, xp, k, v, *, batched: bool) -> None:
        """Alg. 1 lines 4-6 for one token on the device."""
        k2, v2 = k @ k, v @ v
        if not batched:
            for name, x2 in zip(("k", "v"), host_floats(xp, k2, v2)):
                if not math.isfinite(x2):
                    raise InputError(f"{name} contains NaN or Inf (or its squared norm overflows {k.dtype})")
        elif not self._prechecked:  # entries were checked finite by the caller; only the squares may overflow
            self._flag("kv", ~(k2 + v2 < math.inf))
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
        """UpdateSoftmaxNormalizer (lines 11-23). Both branches of line 13 are written: the join at row i* with
        masks that are all False when the token does not join, then the new cluster at row m', which is free
        (beyond the live clusters) when the token joins, so writing it then is harmless."""
        j, R, t, m, dt = self.n, self.R, self.t, self._m_dev, self._X.dtype
        dist = xp.linalg.vector_norm(self._X - k, axis=-1)                  # line 12, every row of the buffer
        dist = xp.where(self._rows < m, dist, math.inf)                    # rows >= m' are not clusters
        i = xp.reshape(xp.argmin(dist), (1,))
        d_i = xp.take(dist, i)
        joined = (d_i if dt == xp.float64 else xp.astype(d_i, xp.float64)) <= self.delta   # line 13, (1,)
        joins = xp.astype(joined, xp.int64)
        c_new = xp.take(self._counts, i) + joins                           # line 14
        self._counts[i] = c_new
        c64 = xp.astype(c_new, xp.float64)
        logc = xp.log(c64 / t)
        self._logc[i] = xp.where(joined, logc if dt == xp.float64 else xp.astype(logc, dt), xp.take(self._logc, i))
        u = xp.reshape(xp.take(self._U, self._u_off + self._coins_t), (R, t))
        hit = (u < 1.0 / c64) & joined                                     # lines 16-17, all t slots
        self._S[i] = xp.where(hit[None, :, :, None], k, xp.take(self._S, i, axis=0))
        self._Sidx[i] = xp.where(hit[None], j, xp.take(self._Sidx, i, axis=0))
        self._X[m] = k                                                     # lines 20-21: (k, [k] * t, 1) at m'
        self._S[m] = k
        self._Sidx[m] = j
        self._counts[m] = 1
        self._logc[m] = -math.log(t)
        self._rep_index[m] = j
        if self.track:
            self._labels.append(xp.where(joined, i, m))
        self._m_dev = m + (1 - joins)
        self._u_off = self._u_off + joins * (R * t)

    def _device_matrix_product(self, xp, k, v, w2) -> None:
        """UpdateMatrixProduct (lines 24-28)."""
        total = self._mu_dev + w2
        p = xp.where(total > 0, w2 / total, 1.0)                           # line 26 (p = 1 while mu = 0)
        u = xp.reshape(xp.take(self._U, self._u_off + self._coins_s), (self.R, self.s))
        hit = u < p
        self._Mk = xp.where(hit[..., None], k, self._Mk)
        self._Mv = xp.where(hit[..., None], v, self._Mv)
        logw = xp.where(w2 > 0, xp.log(w2), math.inf)                      # log 0 = -inf: not taken
        self._Mlogw = xp.where(hit, logw if self._Mlogw.dtype == xp.float64 else xp.astype(logw, self._Mlogw.dtype),
                               self._Mlogw)
        self._Midx = xp.where(hit, self.n, self._Midx)
        self._u_off = self._u_off + self.R * self.s


_MESSAGES = {"kv": "a row of K or V has a squared norm that overflows {dtype}",
             "overflow": "the estimate overflows: logits of M's keys exceed those of the cluster samples "
                         "by more than the float range"}
