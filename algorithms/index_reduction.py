"""The INDEX reduction of BalanceKV-NeurIPS App. C.1 (proof of Thm 3.2; claim LB.index): the hard instance and Bob's decoder.

Alice holds bits x in {0,1}^n (Def. C.1), n a multiple of d. Public coins (shared by Alice and Bob):

* n/d keys k~_1..k~_{n/d} uniform on {-r/sqrt d, +r/sqrt d}^d (so ||k~|| = r; Thm 3.2 assumes r^2 <= d);
* a random partition pi: [n] -> [n/d] x [d] of the bits into groups of d, pi(i) = (group, coordinate),
  every group using every coordinate once;
* signs sigma_1..sigma_n uniform on {-1, +1}.

Bit i gets the key k_i = k~_{pi(i)_1} and the value v_i = sigma_i e_{pi(i)_2}; Alice streams
U = {(k_i, v_i) : x_i = 1} (in the order of i) into the attention approximator. Bob queries q_i = k_i
and reads the value written in the only non-zero coordinate of v_i; he says 1 when it exceeds
(1/40) e^a / max{d e^a, |U|}, a = r^2/sqrt d (:func:`bob_threshold`).

"The value written in the coordinate" is read three ways (``DECODERS``): ``"abs"`` |z_c| (the lemmas
bound |sum_U exp(<k,q_i>/sqrt d) <v, v_i>|), ``"signed"`` sigma_i z_c (= <z, v_i>), ``"literal"`` z_c
(ignores sigma_i: a 1-bit with sigma_i = -1 reads negative; the checks use it as a negative control).

Two forms of the same instance:

* :class:`IndexInstance` -- the construction as written (keys, values, U, the stream), one instance;
* :class:`SlotBatch` -- R instances in slot coordinates (g, c) = pi(i), for the vectorized game. Since
  x and sigma are i.i.d. and Bob's i is uniform, drawing (x, sigma) per slot and Bob's slot (a, b)
  uniformly is the same distribution; BalanceKV-NeurIPS's proof of Lemma C.6 draws i = pi^{-1}(a, b) exactly this way.
  :meth:`IndexInstance.slots` maps an instance to its slot form (tests check the two agree).

Randomness is a numpy ``Generator``; :func:`group_attention` runs on any array-API backend.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, asarray, like, to_numpy

from .validation import InputError

__all__ = ["DECODERS", "DIRECTIONS", "MAX_BITS", "BOB_THRESHOLD_FACTOR", "check_dimension", "check_radius",
           "check_length", "exponent", "bob_threshold", "log2_binomial", "PublicCoins", "draw_public_coins",
           "IndexInstance", "build_instance", "random_instance", "bob_value", "bob_decode", "SlotBatch",
           "draw_slot_batch", "GroupAttention", "group_attention", "lemma_sum", "collisions", "read_values",
           "decode_group", "eq2_error"]

DECODERS = ("abs", "signed", "literal")
DIRECTIONS = ("random", "adversarial", "clairvoyant")
MAX_BITS = 2**31
BOB_THRESHOLD_FACTOR = 1 / 40  # Bob's threshold (1/40) e^a / max{d e^a, |U|}


# the reduction's parameters (BalanceKV-NeurIPS Thm 3.2, App. C.1), also read by kvbounds.theory.lower_bound

def check_dimension(d) -> int:
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
        raise InputError(f"d must be an integer >= 1, got {d!r}")
    return int(d)


def check_radius(d, r) -> float:
    """r > 0 with r^2 <= d (Thm 3.2's assumption); the error names both."""
    d = check_dimension(d)
    if isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(r) or r <= 0:
        raise InputError(f"r must be a finite number > 0, got {r!r}")
    if r * r > d * (1 + 1e-12):
        raise InputError(f"r^2 = {r * r:.6g} > d = {d}: Theorem 3.2 assumes r^2 <= d")
    return float(r)


def check_length(n, d) -> int:
    """n bits in n/d groups of d (App. C.1): n must be a positive multiple of d."""
    d = check_dimension(d)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise InputError(f"n must be an integer >= 1, got {n!r}")
    if n % d:
        raise InputError(f"n = {n} is not a multiple of d = {d}: the reduction partitions the n bits into "
                         f"n/d groups of size d")
    return int(n)


def exponent(d, r) -> float:
    """a = r^2/sqrt(d): the logit <k,k>/sqrt d of a key with itself."""
    r = check_radius(d, r)
    return r * r / math.sqrt(d)


def bob_threshold(d: int, r: float, u_size) -> float:
    """Bob's threshold (1/40) e^a / max{d e^a, |U|} (App. C.1, a = r^2/sqrt d)."""
    a = exponent(d, r)
    return BOB_THRESHOLD_FACTOR * math.exp(a) / max(d * math.exp(a), float(u_size))


def log2_binomial(n: int, k: int) -> float:
    if k < 0 or k > n:
        return 0.0
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise InputError(f"rng must be a numpy Generator, got {type(rng).__name__}")


def _check_decoder(rule: str) -> str:
    if rule not in DECODERS:
        raise InputError(f"decoder rule must be one of {DECODERS}, got {rule!r}")
    return rule


def _signs(rng: np.random.Generator, shape) -> np.ndarray:
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


# ------------------------------------------------------------------------------ one instance

@dataclasses.dataclass(frozen=True)
class PublicCoins:
    """The shared randomness of App. C.1: key signs (n/d, d), the partition pi (n, 2), the signs sigma (n,)."""
    d: int
    r: float
    key_signs: np.ndarray
    partition: np.ndarray
    signs: np.ndarray

    @property
    def n(self) -> int:
        return int(self.partition.shape[0])

    @property
    def groups(self) -> int:
        return self.n // self.d

    @property
    def keys_tilde(self) -> np.ndarray:
        return self.key_signs * (self.r / math.sqrt(self.d))


def draw_public_coins(n: int, d: int, r: float, rng: np.random.Generator) -> PublicCoins:
    """Keys k~ ~ Unif{+-r/sqrt d}^d, the partition pi (bit i -> slot perm[i] = (group, coordinate)), sigma."""
    r = check_radius(d, r)
    n = check_length(n, d)
    _check_rng(rng)
    if n > MAX_BITS:
        raise InputError(f"n = {n} bits is too large (at most {MAX_BITS})")
    key_signs = _signs(rng, (n // d, d))
    perm = rng.permutation(n)
    partition = np.stack([perm // d, perm % d], axis=1).astype(np.int64)
    return PublicCoins(d, r, key_signs, partition, _signs(rng, n))


@dataclasses.dataclass(frozen=True)
class IndexInstance:
    """Alice's bits and the public coins; the dataset of n key/value pairs and the set U."""
    coins: PublicCoins
    bits: np.ndarray   # (n,) bool

    @property
    def d(self) -> int:
        return self.coins.d

    @property
    def r(self) -> float:
        return self.coins.r

    @property
    def n(self) -> int:
        return self.coins.n

    @property
    def keys(self) -> np.ndarray:
        """k_i = k~_{pi(i)_1}, (n, d)."""
        return self.coins.keys_tilde[self.coins.partition[:, 0]]

    @property
    def values(self) -> np.ndarray:
        """v_i = sigma_i e_{pi(i)_2}, (n, d): exactly one non-zero entry per row."""
        V = np.zeros((self.n, self.d))
        V[np.arange(self.n), self.coins.partition[:, 1]] = self.coins.signs
        return V

    @property
    def u_size(self) -> int:
        return int(self.bits.sum())

    def stream(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Alice's stream U = {(k_i, v_i): x_i = 1} in the order of i: (indices, K_U, V_U)."""
        idx = np.flatnonzero(self.bits)
        return idx, self.keys[idx], self.values[idx]

    def query(self, i: int) -> np.ndarray:
        """Bob's query q_i = k_i."""
        return self.keys[self._index(i)]

    def _index(self, i) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.n:
            raise InputError(f"bit index must be an integer in [0, {self.n}), got {i!r}")
        return int(i)

    def coordinate(self, i: int) -> int:
        return int(self.coins.partition[self._index(i), 1])

    def slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key signs (G, d), bits (G, d), sigma (G, d)) indexed by slot (group, coordinate)."""
        G, d = self.coins.groups, self.d
        g, c = self.coins.partition[:, 0], self.coins.partition[:, 1]
        bits, sig = np.zeros((G, d), bool), np.zeros((G, d))
        bits[g, c], sig[g, c] = self.bits, self.coins.signs
        return self.coins.key_signs.copy(), bits, sig


def build_instance(bits, coins: PublicCoins) -> IndexInstance:
    b = np.asarray(bits)
    if b.shape != (coins.n,):
        raise InputError(f"bits must have shape ({coins.n},), got {b.shape}")
    if not np.isin(b, (0, 1)).all():
        raise InputError("bits must be 0/1 (Def. C.1: x ~ Unif{0,1}^n)")
    return IndexInstance(coins, b.astype(bool))


def random_instance(n: int, d: int, r: float, rng: np.random.Generator) -> IndexInstance:
    """x ~ Unif{0,1}^n and fresh public coins."""
    coins = draw_public_coins(n, d, r, rng)
    return build_instance(rng.random(n) < 0.5, coins)


def bob_value(z, i: int, inst: IndexInstance, rule: str = "abs") -> float:
    """The number Bob compares with the threshold: z at v_i's non-zero coordinate, read by ``rule``."""
    _check_decoder(rule)
    zc = float(to_numpy(z)[inst.coordinate(i)])
    return abs(zc) if rule == "abs" else zc * float(inst.coins.signs[i]) if rule == "signed" else zc


def bob_decode(z, i: int, inst: IndexInstance, rule: str = "abs", u_size: int | None = None) -> int:
    """Bob's guess for x_i from an estimate z of Attn(q_i, K_U, V_U); |U| is part of Alice's message."""
    u = inst.u_size if u_size is None else u_size
    return int(bob_value(z, i, inst, rule) > bob_threshold(inst.d, inst.r, u))


# ------------------------------------------------------------------------- R instances, vectorized

@dataclasses.dataclass(frozen=True)
class SlotBatch:
    """R independent instances in slot form, and Bob's slot (group a, coordinate b) in each."""
    d: int
    r: float
    key_signs: np.ndarray   # (R, G, d) +-1
    bits: np.ndarray        # (R, G, d) bool
    signs: np.ndarray       # (R, G, d) +-1
    group: np.ndarray       # (R,)
    coord: np.ndarray       # (R,)

    @property
    def R(self) -> int:
        return int(self.bits.shape[0])

    @property
    def G(self) -> int:
        return int(self.bits.shape[1])

    @property
    def truth(self) -> np.ndarray:
        return self.bits[np.arange(self.R), self.group, self.coord]


def draw_slot_batch(R: int, n: int, d: int, r: float, rng: np.random.Generator, *,
                    shared_key: bool = False) -> SlotBatch:
    """R instances of length n (draws: key signs, bits, sigma, Bob's group, Bob's coordinate).
    ``shared_key=True`` gives every group the same key (a broken construction: a negative control)."""
    r = check_radius(d, r)
    n = check_length(n, d)
    _check_rng(rng)
    if isinstance(R, bool) or not isinstance(R, (int, np.integer)) or R < 1:
        raise InputError(f"R must be an integer >= 1, got {R!r}")
    if R * n > MAX_BITS:
        raise InputError(f"R * n = {R} * {n} bits is too large (at most {MAX_BITS})")
    G = n // d
    ks = _signs(rng, (R, 1 if shared_key else G, d))
    ks = np.broadcast_to(ks, (R, G, d)).copy()
    bits = rng.random((R, G, d)) < 0.5
    sig = _signs(rng, (R, G, d))
    return SlotBatch(d, r, ks, bits, sig, rng.integers(0, G, R), rng.integers(0, d, R))


@dataclasses.dataclass(frozen=True)
class GroupAttention:
    """Exact attention of every instance's query q = k~_a over U, with the sums the lemmas talk about.

    ``z`` (R, d) = Attn(q, K_U, V_U); ``D`` = sum_U exp(<k,q>/sqrt d); ``sq`` = sum_U exp(2<k,q>/sqrt d)
    (= ||exp(K_U q/sqrt d)||^2, so ||softmax|| = sqrt(sq)/D); ``u`` = |U|; ``u_group`` = |U^i| (ones in
    group a); ``weights`` (R, G) = exp(<k~_g, q>/sqrt d - a). An instance whose U is empty has z = 0, D = 0."""
    z: np.ndarray
    D: np.ndarray
    sq: np.ndarray
    u: np.ndarray
    u_group: np.ndarray
    weights: np.ndarray
    a: float

    @property
    def softmax_norm(self) -> np.ndarray:
        """||softmax(K_U q/sqrt d)||_2 (0 where U is empty)."""
        return np.sqrt(self.sq) / np.where(self.D > 0, self.D, 1.0)


def group_attention(batch: SlotBatch, backend: str = "numpy") -> GroupAttention:
    """Attn(k~_a, K_U, V_U) for every instance, computed on ``backend`` (array API); numpy results."""
    R, G, d = batch.bits.shape
    a = exponent(d, batch.r)
    S = asarray(batch.key_signs, backend)
    xp = array_namespace(S)
    onehot = np.zeros((R, G))
    onehot[np.arange(R), batch.group] = 1.0
    q = xp.sum(S * like(onehot, S)[:, :, None], axis=1)                         # (R, d) key signs of group a
    # <k~_g, k~_a>/sqrt d = (r^2/d) <signs>/sqrt d; shifted by a so the query's own group has weight 1
    logits = xp.matmul(S, q[:, :, None])[:, :, 0] * (batch.r ** 2 / d / math.sqrt(d)) - a
    w = xp.exp(logits)                                                           # (R, G)
    B = like(batch.bits.astype(float), S)
    cnt = xp.sum(B, axis=-1)                                                     # (R, G) ones per group
    D_rel = xp.sum(w * cnt, axis=-1)
    sq_rel = xp.sum(w * w * cnt, axis=-1)
    num = xp.matmul(w[:, None, :], B * like(batch.signs, S))[:, 0, :]            # (R, d)
    Dn = to_numpy(D_rel)
    empty = Dn <= 0     # U empty (probability 2^-n): z := 0; Bob, told |U| = 0, answers 0 and is right
    z = to_numpy(num) / np.where(empty, 1.0, Dn)[:, None]
    cnt_np = to_numpy(cnt)
    return GroupAttention(z=z, D=Dn * math.exp(a), sq=to_numpy(sq_rel) * math.exp(2 * a),
                          u=cnt_np.sum(-1), u_group=cnt_np[np.arange(R), batch.group], weights=to_numpy(w), a=a)


def lemma_sum(batch: SlotBatch, att: GroupAttention) -> np.ndarray:
    """sum_{(k,v) in U} exp(<k, q_i>/sqrt d) <v, v_i> for Bob's bit i = (a, b) (Lemmas C.4, C.6)."""
    idx = np.arange(batch.R)
    return att.z[idx, batch.coord] * att.D * batch.signs[idx, batch.group, batch.coord]


def collisions(batch: SlotBatch) -> np.ndarray:
    """|U_i|: pairs of U other than bit i whose value is non-zero in v_i's coordinate."""
    col = batch.bits[np.arange(batch.R), :, batch.coord]                          # (R, G)
    return col.sum(-1) - batch.truth.astype(int)


def read_values(batch: SlotBatch, z: np.ndarray, rule: str) -> np.ndarray:
    """(R, d): what Bob would read for every bit of group a (one query serves the whole group)."""
    _check_decoder(rule)
    sig = batch.signs[np.arange(batch.R), batch.group]                           # (R, d)
    return np.abs(z) if rule == "abs" else z * sig if rule == "signed" else z


def decode_group(batch: SlotBatch, z: np.ndarray, u, rule: str = "abs") -> np.ndarray:
    """(R, d) Bob's guesses for every bit of group a from estimates z (R, d)."""
    thr = np.array([bob_threshold(batch.d, batch.r, x) for x in np.atleast_1d(u)])
    return read_values(batch, z, rule) > thr[:, None]


def eq2_error(batch: SlotBatch, att: GroupAttention, eps: float, direction: str, rng: np.random.Generator,
              rule: str = "abs") -> np.ndarray:
    """An error vector (R, d) of norm exactly eps ||softmax||_2 ||V_U||_F (eq. (2)'s allowance; ||V_U||_F =
    sqrt|U| since every value is a unit vector).

    ``random``: a uniform direction. ``adversarial``: knows U and the query (hence group a) but not Bob's b;
    spreads the error evenly, each coordinate pushed towards the wrong answer for the bit of group a living
    there. ``clairvoyant``: knows b too and puts all the error there (outside the model: a control)."""
    if direction not in DIRECTIONS:
        raise InputError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise InputError(f"eps must be a finite number >= 0, got {eps!r}")
    size = eps * att.softmax_norm * np.sqrt(att.u)                                # (R,)
    R, d = att.z.shape
    if direction == "random":
        g = rng.standard_normal((R, d))
        return g / np.linalg.norm(g, axis=1, keepdims=True) * size[:, None]
    idx = np.arange(R)
    ones = batch.bits[idx, batch.group]                                          # (R, d) the group's bits
    sig = batch.signs[idx, batch.group]
    # the sign that makes Bob's reading larger: sigma (signed), sign(z) (abs, literal reads +)
    up = sig if rule == "signed" else np.where(att.z >= 0, 1.0, -1.0) if rule == "abs" else np.ones((R, d))
    push = np.where(ones, -up, up)                                               # away from the truth
    if direction == "adversarial":
        return push * (size / math.sqrt(d))[:, None]
    e = np.zeros((R, d))
    e[idx, batch.coord] = push[idx, batch.coord] * size
    return e
