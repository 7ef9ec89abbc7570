"""SubGen's estimator maintained online at a fixed size (SubGen Alg. 1, Thm 1; ClusterGen Thm 2.4; claims SG.decode,
SG.attention), batched over layers, rows and KV heads in torch.

The compressed middle has ``m * t`` cluster slots then ``s`` value slots:

* denominator: keys are assigned to the nearest of ``m`` centres (the centres are the first keys to arrive,
  picked farthest-first, SubGen's x_i); each cluster keeps its count n_i and ``t`` independent uniform samples
  of its members (a reservoir per slot: a slot takes a uniform new member with probability c_i / (n_i + c_i));
  a cluster slot has log_w_den = log(n_i / t) and log_w_num = -inf, so sum over the slots e^{l + b} is SubGen's tau;
* numerator: ``s`` independent l2 samples of the tokens, Pr[j] = ||v_j||^2 / W with W = sum ||v||^2 (Lemma 1; a
  slot keeps its token with probability W_old / W_new or takes new token j with probability ||v_j||^2 / W_new),
  log_w_num = log(W / (s ||v_j||^2)), log_w_den = -inf, so sum over the slots e^{l + a} v is SubGen's z.

Where this differs from the paper: the number of centres is fixed (the cache has a fixed size), so the cluster
radius delta is whatever the stream gives (recorded, it enters the bound's scale e^{2 delta r}); SubGen opens a new
cluster whenever a key is farther than delta from every centre. The sink and the recent window are exact (weight 0
on both sides); SubGen has neither.

The estimate :meth:`SubGenState.standard_errors` (the live certificate's ingredient) is the sampling standard error
of both sums from the slots themselves (sample variance / number of samples): an estimate, not a bound.
"""
from __future__ import annotations

import math

import torch


def _gumbel(u):
    u = u.clamp(1e-300, 1.0 - 1e-16)
    return -torch.log(-torch.log(u))


class SubGenState:
    """The online state of B = layers * rows * KV heads streams (see the module docstring)."""

    def __init__(self, B: int, d: int, e: int, *, clusters: int, per_cluster: int, samples: int):
        self.m, self.t, self.s = clusters, per_cluster, samples
        self.centres = torch.zeros(B, 0, d, dtype=torch.float64)
        self.counts = torch.zeros(B, clusters, dtype=torch.float64)
        self.radius = torch.zeros(B, dtype=torch.float64)     # max distance of a member to its centre
        self.W = torch.zeros(B, dtype=torch.float64)          # sum ||v||^2 of every token absorbed
        self.seen = 0

    @property
    def slots(self) -> int:
        return self.m * self.t + self.s

    def copy(self) -> "SubGenState":
        c = SubGenState.__new__(SubGenState)
        c.m, c.t, c.s, c.seen = self.m, self.t, self.s, self.seen
        c.centres, c.counts, c.radius, c.W = (x.clone() for x in (self.centres, self.counts, self.radius, self.W))
        return c

    def absorb(self, Km, Vm, Kx, Vx, alive, uniform):
        """Middle slots Km, Vm (B, slots, .) and new tokens Kx, Vx (B, E, .) with ``alive`` (B, E) -> the new middle
        (K, V, log_w_num, log_w_den); the slots' weights follow from the state (counts, W). ``uniform(*shape)`` ->
        (B, *shape) float64 uniforms in [0, 1), each stream's rows from its own random stream."""
        B, E, d = Kx.shape
        m, t, s = self.m, self.t, self.s
        Kx64, Vx64 = Kx.double(), Vx.double()
        # centres: the free ones are filled farthest-first from the new keys (the first: the first live key)
        for _ in range(min(m - self.centres.shape[1], E)):
            if self.centres.shape[1] == 0:
                pick = alive.to(torch.float64).argmax(-1)
            else:
                pick = torch.cdist(Kx64, self.centres).min(-1).values.masked_fill(~alive, -1.0).argmax(-1)
            self.centres = torch.cat([self.centres, Kx64[torch.arange(B), pick][:, None]], 1)
        dist = torch.cdist(Kx64, self.centres)                                        # (B, E, mc)
        near, assign = dist.min(-1)
        self.radius = torch.maximum(self.radius, near.masked_fill(~alive, 0.0).max(-1).values)
        onehot = torch.nn.functional.one_hot(assign, m).to(torch.float64) * alive[..., None]   # (B, E, m)
        new_counts = onehot.sum(1)                                                    # (B, m)
        total = self.counts + new_counts
        p_new = torch.where(total > 0, new_counts / total.clamp_min(1.0), 0.0)        # (B, m)
        ck = Km[:, :m * t].reshape(B, m, t, d)
        cv = Vm[:, :m * t].reshape(B, m, t, -1)
        take = uniform(m, t) < p_new[..., None]
        score = _gumbel(uniform(m, t, E)).masked_fill(onehot.transpose(1, 2)[:, :, None, :] == 0, -math.inf)
        member = score.argmax(-1)                                                     # (B, m, t)
        bidx = torch.arange(B)[:, None, None]
        ck = torch.where(take[..., None], Kx[bidx, member], ck)
        cv = torch.where(take[..., None], Vx[bidx, member], cv)
        self.counts = total
        filled = self.counts > 0
        den = torch.where(filled, torch.log(self.counts.clamp_min(1.0) / t), -math.inf)[..., None].expand(B, m, t)
        # values: l2 reservoir, one categorical draw per slot over [keep, new tokens]
        omega = (Vx64 * Vx64).sum(-1) * alive                                          # (B, E)
        W_new = self.W + omega.sum(-1)
        logits = torch.cat([torch.log(self.W)[:, None], torch.log(omega)], -1)         # (B, 1 + E)
        choice = (logits[:, None, :] + _gumbel(uniform(s, 1 + E))).argmax(-1)          # (B, s)
        sk, sv = Km[:, m * t:], Vm[:, m * t:]
        src = (choice - 1).clamp_min(0)
        sk = torch.where((choice > 0)[..., None], Kx[torch.arange(B)[:, None], src], sk)
        sv = torch.where((choice > 0)[..., None], Vx[torch.arange(B)[:, None], src], sv)
        self.W = W_new
        self.seen += E
        w_slot = (sv.double() ** 2).sum(-1)
        num = torch.where((w_slot > 0) & (W_new[:, None] > 0), torch.log(W_new[:, None] / (s * w_slot)), -math.inf)
        K = torch.cat([ck.reshape(B, m * t, d), sk], 1)
        V = torch.cat([cv.reshape(B, m * t, -1), sv], 1)
        a = torch.cat([torch.full((B, m * t), -math.inf, dtype=torch.float64), num], 1).float()
        b = torch.cat([den.reshape(B, m * t), torch.full((B, s), -math.inf, dtype=torch.float64)], 1).float()
        return K, V, a, b

    def standard_errors(self, Km, Vm, logits):
        """Sampling standard errors of the two sums at queries with ``logits`` (B, Lq, slots) = <q, k> scale over the
        middle slots Km, Vm (B, slots, .): (se_num (B, Lq), se_den (B, Lq)), in units of e^{max logit} (the
        second return value, (B, Lq)), so they compare with the estimator's sums shifted by the same maximum."""
        m, t, s = self.m, self.t, self.s
        mx = logits.max(-1).values
        x = torch.exp(logits.double() - mx[..., None])                                  # (B, Lq, slots)
        cl = x[..., :m * t].reshape(*x.shape[:-1], m, t) * self.counts[:, None, :, None]  # n_i e^{l}
        var_den = (cl.var(-1, unbiased=True) / t).sum(-1) if t > 1 else torch.zeros_like(mx, dtype=torch.float64)
        w_slot = (Vm[:, m * t:].double() ** 2).sum(-1).clamp_min(1e-300)              # (B, s)
        terms = (self.W[:, None] / w_slot)[:, None, :, None] * x[..., m * t:, None] * Vm[:, None, m * t:].double()
        var_num = terms.var(2, unbiased=True).sum(-1) / s if s > 1 else torch.zeros_like(var_den)
        return var_num.sqrt(), var_den.sqrt(), mx
