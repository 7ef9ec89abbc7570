"""QueryStreamAttn of SubGen Alg. 1 (lines 29-31; ClusterGen Alg. 1 numbers them one lower), the estimator half of
:class:`kvbounds.algorithms.subgen.SubGen` ("SubGen: Token Generation in Sublinear Time and Memory", arXiv
2402.06082; claims SG.partition, SG.matprod, SG.attention)::

    29  z   = sum_{(k,v) in M} mu / (s ||v||^2) * exp(<q,k>) * v
    30  tau = sum_{(x,S,n') in D} n'/t * sum_{k in S} exp(<q,k>)
    31  return z / tau

Both sums are formed in the log domain (shifted by their largest term), so they neither overflow nor underflow.

Speed (numpy, one query vector): ``query`` reshapes the cluster samples S (m', R, t, d) and M's keys
(R, s, d) to matrices, so each of lines 29-30 is one matrix-vector product instead of a stack of m' R tiny
ones. The sums run in another order than on the generic path (tests compare the two, ``SubGen.fast = False``).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.arrays import device as _dev

from .host_values import host_floats
from .validation import InputError

__all__ = ["QueryStreamAttn"]


class QueryStreamAttn:
    """Lines 29-31 on the state a :class:`kvbounds.algorithms.subgen.SubGen` keeps (``_Mk``, ``_Mv``, ``_Mlogw``
    for M; ``_S``, ``_logc`` for D; ``mu``, ``s``, ``t``, ``R``, ``m``, ``scale``); SubGen inherits it."""

    def query_parts(self, q):
        """The two estimates in the log domain: ``(log_z_shift, z_scaled, log_tau)`` with
        ``z = exp(log_z_shift) * z_scaled`` (line 29) and ``tau = exp(log_tau)`` (line 30).

        ``q`` (d,) or (nq, d). Shapes: z_scaled (dv,), (nq, dv), (R, dv) or (R, nq, dv) (leading R when
        ``replicas`` is set); log_z_shift and log_tau the same without the last axis. log_z_shift is
        -inf (and z = 0) while every value seen is 0."""
        self._check_query(q)
        xp = self._xp
        if not bool(xp.all(xp.isfinite(q))):
            raise InputError("q contains NaN or Inf")
        return self._query_parts(q)

    def _check_query(self, q) -> None:
        if self.n == 0:
            raise InputError("query on an empty stream: call update() first")
        if type(q) is not self._atype or q.dtype != self._X.dtype:
            raise InputError(f"q must be a {self._atype.__name__} with the stream's dtype {self._X.dtype}, "
                             f"got {type(q).__name__} {getattr(q, 'dtype', '')}")
        if q.ndim not in (1, 2) or q.shape[-1] != self.d:
            raise InputError(f"q must have shape ({self.d},) or (nq, {self.d}), got {tuple(q.shape)}")

    def _query_parts(self, q):
        """query_parts for a checked q."""
        xp = self._xp
        single = q.ndim == 1
        QT = (q[:, None] if single else xp.matrix_transpose(q)) * self.scale          # (d, nq)
        # m' from the device when the state lives there: the sums below run over exactly m' clusters (a
        # data-dependent count), as on the host path; summing the masked buffer would round differently
        R, nq, dv, m = self.R, QT.shape[1], self.dv, self.m
        # line 29: z = sum_M mu/(s w) e^{<q,k>} v, in the log domain: log(mu/(s w)) = log(mu/s) - log w
        if self._on_device:                                            # mu on the device: both branches, xp.where
            dt = self._X.dtype
            pos = self._mu_dev > 0
            lmu = xp.astype(xp.log(self._mu_dev / self.s), dt)
            lz = xp.matmul(self._Mk, QT) + (lmu - self._Mlogw)[..., None]                      # (R, s, nq)
            zshift = xp.max(lz, axis=1)                                                          # (R, nq)
            z = xp.matmul(xp.permute_dims(xp.exp(lz - zshift[:, None, :]), (0, 2, 1)), self._Mv)  # (R, nq, dv)
            zshift = xp.where(pos, zshift, xp.full_like(zshift, -math.inf))
            z = xp.where(pos, z, xp.zeros_like(z))
        elif self.mu > 0:
            lz = xp.matmul(self._Mk, QT) + (math.log(self.mu / self.s) - self._Mlogw)[..., None]   # (R, s, nq)
            zshift = xp.max(lz, axis=1)                                                          # (R, nq)
            z = xp.matmul(xp.permute_dims(xp.exp(lz - zshift[:, None, :]), (0, 2, 1)), self._Mv)  # (R, nq, dv)
        else:                                                          # every value so far is 0: z = 0
            dev = _dev(self._X)
            zshift = xp.full((R, nq), -math.inf, dtype=self._X.dtype, device=dev)
            z = xp.zeros((R, nq, dv), dtype=self._X.dtype, device=dev)
        # line 30: tau = sum_D n'/t sum_S e^{<q,k>}
        lS = xp.matmul(self._S[:m, ...], QT) + self._logc[:m, None, None, None]            # (m, R, t, nq)
        tshift = xp.max(lS, axis=(0, 2))                                                    # (R, nq)
        log_tau = tshift + xp.log(xp.sum(xp.exp(lS - tshift[None, :, None, :]), axis=(0, 2)))
        if single:
            zshift, z, log_tau = zshift[:, 0], z[:, 0, :], log_tau[:, 0]
        if self.replicas is None:
            zshift, z, log_tau = zshift[0], z[0], log_tau[0]
        return zshift, z, log_tau

    def query(self, q):
        """z / tau (line 31): the estimate of Attn(q, K_n, V_n) (paper convention exp(<q,k>) unless ``scaled``).
        Shape (dv,) for one q, (nq, dv) for a batch, with a leading R axis whenever ``replicas`` is set (also for
        replicas=1), on every backend."""
        if self.fast and self._is_numpy and type(q) is np.ndarray and q.shape == (self.d,) \
                and q.dtype == self._X.dtype and self.mu > 0:
            out = self._query_numpy(q)
            if out is not None:
                return out
        if self._on_device:
            return self._device_query(q, deferred=False)
        zshift, z, log_tau = self.query_parts(q)
        if self.mu == 0:
            return z
        xp = self._xp
        factor = xp.exp(zshift - log_tau)
        if not bool(xp.all(xp.isfinite(factor))):
            raise InputError("the estimate overflows: logits of M's keys exceed those of the cluster samples "
                             "by more than the float range")
        return z * factor[..., None]

    def _device_query(self, q, *, deferred: bool):
        """query() with mu on the device: both branches of ``mu == 0`` through xp.where; the checks of q and of
        the overflow in one read, or (``deferred``, inside stream()) flagged for the read at the end of the call."""
        self._check_query(q)
        xp = self._xp
        zshift, z, log_tau = self._query_parts(q)
        factor = xp.exp(zshift - log_tau)
        pos = self._mu_dev > 0
        overflow = pos & ~xp.all(xp.isfinite(factor))
        if deferred:                                                   # q's rows were checked by the caller
            self._flag("overflow", overflow)
        else:
            q_ok, bad = host_floats(xp, xp.all(xp.isfinite(q)), overflow)
            if not q_ok:
                raise InputError("q contains NaN or Inf")
            if bad:
                raise InputError("the estimate overflows: logits of M's keys exceed those of the cluster samples "
                                 "by more than the float range")
        return xp.where(pos, z * factor[..., None], z)

    def _query_numpy(self, q):
        """query() for one numpy q with mu > 0: lines 29-31 as two matrix-vector products; None when q is not
        finite or the estimate overflows (the generic path then raises its error)."""
        R, m, d = self.R, self.m, self.d
        qs = q * self.scale if self.scale != 1.0 else q
        if R == 1:                                                          # flat arrays: the common case
            lz = self._Mk[0] @ qs
            lz += math.log(self.mu / self.s)
            lz -= self._Mlogw[0]                                            # line 29, log domain
            zshift = lz.max()
            lz -= zshift
            np.exp(lz, out=lz)
            z = lz @ self._Mv[0]
            lS = (self._S[:m].reshape(m * self.t, d) @ qs).reshape(m, self.t)
            lS += self._logc[:m, None]                                      # line 30
            tshift = lS.max()
            lS -= tshift
            np.exp(lS, out=lS)
            ex = float(zshift) - (float(tshift) + math.log(float(lS.sum())))
            if not ex < 700.0:                                              # overflow or NaN: generic path
                return None
            factor = math.exp(ex)
            out = z * factor
            if not (math.isfinite(factor) and math.isfinite(float(out.sum()))):
                return None
            return out if self.replicas is None else out[None]    # replicas=1 set: (1, dv), as the generic path
        lz = (self._Mk.reshape(R * self.s, d) @ qs).reshape(R, self.s)
        lz += math.log(self.mu / self.s)
        lz -= self._Mlogw                                                   # line 29, log domain
        zshift = lz.max(axis=1)
        lz -= zshift[:, None]
        np.exp(lz, out=lz)
        z = np.einsum("rs,rsv->rv", lz, self._Mv)
        lS = (self._S[:m].reshape(m * R * self.t, d) @ qs).reshape(m, R, self.t)
        lS += self._logc[:m, None, None]                                    # line 30
        tshift = lS.max(axis=(0, 2))
        lS -= tshift[None, :, None]
        np.exp(lS, out=lS)
        log_tau = tshift + np.log(lS.sum(axis=(0, 2)))
        factor = np.exp(zshift - log_tau)
        if not (np.all(np.isfinite(factor)) and np.all(np.isfinite(z))):
            return None
        out = z * factor[:, None]
        return out if self.replicas is not None else out[0]
