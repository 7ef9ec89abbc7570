"""The walk diagnostics (kvbounds.algorithms.walk_diagnostics): exact cases worked by hand, the same signs as the
package's walks (pseudocode, released, streaming) from the same uniforms, the centring identity, and the walk
moving signs where its kernel has something to balance."""
import math

import numpy as np
import pytest

from kvbounds.algorithms import walk_diagnostics as wd
from kvbounds.algorithms.balance_kv_released import cut_weights, released_select
from kvbounds.algorithms.block_walk import block_gram
from kvbounds.algorithms.self_balancing_walk import gram_walk, walk_constant
from kvbounds.algorithms.validation import InputError

EPS = np.finfo(np.float64).eps


def _unit_blocks(seed, lead=(4,), n=64, d=8, s=8):
    rng = np.random.default_rng(seed)
    K = rng.standard_normal(lead + (n, d))
    K /= np.linalg.norm(K, axis=-1, keepdims=True)
    return K, rng.standard_normal(lead + (n, s)) / math.sqrt(s), rng


# -------------------------------------------------------------------------------- exact cases

def test_diagonal_gram_has_nothing_to_balance():
    """Orthonormal values and const 0 make G diagonal (exactly: <v_i, v_j> = 0); then x_i = 0 at every step, so
    every rule draws the coin (the released rule: p = 1/2 after its fixed first sign) and eta^T G eta = tr G."""
    rng = np.random.default_rng(0)
    n = 12
    K = rng.standard_normal((n, 5)) * 3.0
    V = np.eye(n) * rng.uniform(0.5, 2.0, n)[:, None]
    out = wd.block_diagnostics(K, V, rng=rng, const=0.0, gamma=4.0)
    for key in ("offdiag_share", "cosine_offdiag_share", "max_coherence"):
        assert out[key] == 0.0
    for rule in wd.RULES:
        assert out[f"{rule}_equal_random"] == 1.0
        # eta^T G eta sums the same n diagonal terms as tr G in another order: within n eps relatively
        assert abs(out[f"{rule}_disc_ratio"] - 1.0) <= n * EPS
    assert out["theorem_mean_abs_p_dev"] == 0.0


U4 = np.array([0.1, 0.2, 0.7, 0.9])          # random rule: + + - -


def _duplicates():
    """Equal keys (k = 0: e^{<k, k'>} = 1 exactly) and values v1, v1, v2, v2 with v1 orthogonal to v2, const 0: G is
    two all-ones 2 x 2 blocks, exactly."""
    K = np.zeros((4, 3))
    V = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    return K, V


def test_duplicated_keys_by_hand():
    K, V = _duplicates()
    G = wd.exp_kernel_gram(K, V, const=0.0).gram
    assert np.array_equal(G, np.kron(np.eye(2), np.ones((2, 2))))
    c = walk_constant(4, 0.01)
    out = wd.block_diagnostics(K, V, uniforms=U4, const=0.0, delta=0.01, gamma=4.0)
    assert out["offdiag_share"] == 0.5 and out["cosine_offdiag_share"] == 0.5 and out["max_coherence"] == 1.0
    # greedy: + (coin), - (x = +1), - (x = 0: coin u = 0.7), + (x = -1): each pair cancels, discrepancy 0
    assert out["greedy_disc_ratio"] == 0.0 and out["greedy_equal_random"] == pytest.approx(1 / 3)
    # random: (1 + 1)^2 + (-1 - 1)^2 = 8 over tr G = 4
    assert out["random_disc_ratio"] == 2.0
    # theorem at c = 30 log(400): p_1 = 1/2 - 1/(2c) = 0.497 > 0.2, p_3 = 1/2 + 1/(2c) < 0.9: the coin's signs
    assert out["theorem_equal_random"] == 1.0 and out["theorem_disc_ratio"] == 2.0
    assert out["theorem_mean_abs_p_dev"] == pytest.approx(1 / (4 * c), rel=4 * EPS)
    # released (e^{log_scale} = 1): first +1, then p = 1/2 - 4 (-), p = 1/2 (u = 0.7: -), p = 1/2 + 4 (+)
    assert out["released_disc_ratio"] == 0.0 and out["released_equal_random"] == pytest.approx(1 / 3)
    # the theorem walk at c = 1 is greedy here: p_1 = 0, p_3 = 1
    small = wd.block_diagnostics(K, V, uniforms=U4, const=0.0, c=1.0)
    assert small["theorem_disc_ratio"] == 0.0 and small["theorem_equal_random"] == pytest.approx(1 / 3)
    signs = wd.rule_signs(G, U4, c=1.0, gamma=4.0)
    assert signs["greedy"].tolist() == [1, -1, -1, 1] and signs["random"].tolist() == [1, 1, -1, -1]
    assert signs["released"].tolist() == [1, -1, -1, 1]


def test_released_rule_reads_the_true_scale():
    """The released rule compares gamma e^{log_scale} x with 1/2: the same x decides nothing at e^-30 and
    everything at e^800 (beyond float64, taken in logs)."""
    G = np.kron(np.eye(2), np.ones((2, 2)))
    tiny = wd.rule_signs(G, U4, c=1.0, gamma=4.0, log_scale=-30.0)["released"]
    huge = wd.rule_signs(G, U4, c=1.0, gamma=4.0, log_scale=800.0)["released"]
    assert tiny.tolist() == [1, 1, -1, -1][:1] + [1, -1, -1]        # p ~ 1/2: the coin after the fixed +1
    assert huge.tolist() == [1, -1, -1, 1]


# -------------------------------------------------------------------------------- the package's walks

@pytest.mark.parametrize("c", [0.5, 2.0, None])
def test_theorem_rule_is_the_pseudocode_walk(c):
    """Alg. 2 on blockwise BalanceKV's kernel (w = [v, 1], R^2 from the block's largest norms: block_gram) gives the
    theorem rule's signs from the same uniforms."""
    K, V, rng = _unit_blocks(1)
    K = K * 2.0
    n = K.shape[-2]
    c = walk_constant(n, 0.01) if c is None else c
    U = rng.random(K.shape[:-1])
    W = np.concatenate([V, np.ones(V.shape[:-1] + (1,))], axis=-1)
    Gp = block_gram(K, W, scale=1 / math.sqrt(K.shape[-1]))
    ref = np.stack([gram_walk(Gp[b], U[b], c, on_fail="continue").signs for b in range(K.shape[0])])
    kg = wd.exp_kernel_gram(K, V, const=1.0)
    # one matrix computed in two orders of operations: the exponent (<= s max||k||^2 = 4 / sqrt 8 in size) carries a
    # rounding of a few (d + 2) eps of it (relative to the entry), <v, v'> + 1 one of a few (s + 2) eps of
    # max(||v||^2 + 1) (absolute, entries <= 1 after normalisation): 4x both
    d, s = K.shape[-1], V.shape[-1]
    np.testing.assert_allclose(kg.gram / kg.r2[:, None, None], Gp, rtol=4 * (d + 2) * EPS * 4 / math.sqrt(d),
                               atol=4 * (s + 2) * EPS)
    mine = wd.rule_signs(kg.gram, U, c=c, r2=kg.r2)["theorem"]
    assert np.array_equal(mine, ref)
    if c < 1:
        assert not np.array_equal(mine, wd.rule_signs(kg.gram, U, c=c)["random"])    # the walk moved signs


@pytest.mark.parametrize("temp", [0.1, 1.0])
def test_released_rule_is_the_released_walk(temp):
    """One block, one level of released_select with replayed uniforms: its kept tokens are the one-cut selection
    (cut_weights, stable sort) of the released rule's signs on the centred released kernel."""
    rng = np.random.default_rng(2)
    b, d = 32, 8
    K = rng.standard_normal((1, b, d)) * 2.0 + 3.0
    V = rng.standard_normal((1, b, 4))
    U = rng.random((1, 1, b))
    idx, _ = released_select(K, V, levels=1, block_size=b, uniforms=lambda shape: U.reshape(shape), temp=temp)
    kg = wd.exp_kernel_gram(K, V, temp=temp, const=wd.RELEASED_CONST, centre=True)
    s = wd.rule_signs(kg.gram, U[:, 0], c=1.0, gamma=4.0, log_scale=kg.log_scale)["released"]
    wt = cut_weights(s.astype(np.int64))
    assert np.array_equal(np.argsort(-wt, axis=-1, kind="stable")[:, : b // 2], np.asarray(idx))


def test_theorem_rule_is_the_streaming_walk():
    """kvbounds.presses._streaming.balance: the walk on pair differences (c = 30 log(P / 0.01) max_p D_pp) gives the
    theorem
    rule's signs on D with r2 = max diag (the default)."""
    torch = pytest.importorskip("torch")
    from kvbounds.presses._streaming.balance import pair_gram, walk_signs
    rng = np.random.default_rng(3)
    B, P, d = 5, 24, 8
    K = torch.as_tensor(rng.standard_normal((B, 2 * P, d)) * 0.5)
    V = torch.as_tensor(rng.standard_normal((B, 2 * P, 4)))
    D, _, _ = pair_gram(K, V, torch.ones(B, 2 * P, dtype=torch.bool), 1 / math.sqrt(d))
    u = torch.as_tensor(rng.random((B, P)))
    for c in (30.0 * math.log(P / 0.01), 0.5):     # the theorem's c, and one small enough that the walk decides
        ref, _ = walk_signs(D, u, delta=P * math.exp(-c / 30.0))
        mine = wd.rule_signs(D.numpy(), u.numpy(), c=c)
        assert np.array_equal(mine["theorem"], ref.numpy())
        if c < 1:
            assert not np.array_equal(mine["theorem"], mine["random"])


# -------------------------------------------------------------------------------- centring, moving signs

def test_centring_reweights_the_same_vectors():
    """G(k - mu) = Lambda G(k) Lambda e^{s ||mu||^2}, lambda_i = e^{-s <k_i, mu>}: the cosine Gram is unchanged.
    Both cosine Grams equal e^{-s ||k_i - k_j||^2 / 2} (w-cosine), computed from exponents of size s max||k||^2 ~ 9
    here, whose rounding (a few eps times that) bounds the difference: 1e-12 leaves a 100x margin."""
    K, V, rng = _unit_blocks(4)
    K = K * 3.0 + 1.0
    out = wd.centring_comparison(K, V, rng=rng)
    for key in ("cosine_offdiag_share", "max_coherence", "key_distance"):
        np.testing.assert_allclose(out["raw"][key], out["centred"][key], rtol=1e-12)
    s = 1 / math.sqrt(K.shape[-1])
    raw, cen = wd.exp_kernel_gram(K, V), wd.exp_kernel_gram(K, V, centre=True)
    mu = K.mean(axis=-2, keepdims=True)
    log_lam = -s * np.einsum("bnd,bmd->bn", K, mu)
    pred = raw.gram * np.exp(log_lam[:, :, None] + log_lam[:, None, :] + s * (mu[:, 0] ** 2).sum(-1)[:, None, None]
                             + raw.log_scale[:, None, None] - cen.log_scale[:, None, None])
    np.testing.assert_allclose(cen.gram, pred, rtol=1e-12, atol=0)


def test_the_walk_moves_signs_on_synthetic_unit_keys():
    """Random unit keys at d = 8 (blockwise kernel w = [v, 1]): the Gram is far from diagonal (off-diagonal share
    > 0.9) and greedy takes most of the discrepancy off (ratio < 0.5, measured ~0.15-0.2); the walk at the theorem's
    c moves few signs (it is nearly the coin) but some; at c = 1 it moves many and balances (ratio < 0.5). Fixed
    seeds: deterministic values, the bounds are 2x or more away from them."""
    K, V, rng = _unit_blocks(5, lead=(8,), n=128)
    out = wd.block_diagnostics(K, V, rng=rng)
    assert np.all(out["offdiag_share"] > 0.9) and np.all(out["greedy_disc_ratio"] < 0.5)
    assert np.min(out["theorem_equal_random"]) < 1.0 and np.all(out["theorem_mean_abs_p_dev"] > 0)
    small = wd.block_diagnostics(K, V, rng=np.random.default_rng(6), c=1.0)
    assert np.all(small["theorem_disc_ratio"] < 0.5) and np.all(small["theorem_equal_random"] < 0.9)


def test_deterministic_given_a_generator():
    K, V, _ = _unit_blocks(7)
    a = wd.centring_comparison(K, V, rng=np.random.default_rng(11), temp=0.1, const=wd.RELEASED_CONST)
    b = wd.centring_comparison(K, V, rng=np.random.default_rng(11), temp=0.1, const=wd.RELEASED_CONST)
    for side in ("raw", "centred"):
        for key, val in a[side].items():
            assert np.array_equal(val, b[side][key]), key


def test_summarize():
    assert wd.summarize([3.0, 1.0, 2.0]) == dict(median=2.0, min=1.0, max=3.0, mean=2.0)
    with pytest.raises(InputError):
        wd.summarize([])


# -------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("bad", [
    dict(G=np.array([[1.0, 2.0], [0.0, 1.0]])),                         # not symmetric
    dict(G=np.array([[-1.0, 0.0], [0.0, 1.0]])),                        # negative diagonal
    dict(uniforms=np.array([0.5, 1.0])),                                # a uniform outside [0, 1)
    dict(uniforms=np.array([0.5, 0.5, 0.5])),                           # wrong length
    dict(G=np.array([[np.nan, 0.0], [0.0, 1.0]])),
    dict(c=0.0), dict(c=math.inf), dict(c="1"), dict(r2=-1.0), dict(r2=np.ones(3)), dict(gamma=-1.0),
    dict(log_scale=math.nan), dict(G=np.ones((2, 3))), dict(G=[[1.0, 0.0], [0.0, 1.0]]),
])
def test_walk_diagnostics_refuses_bad_input(bad):
    kw = dict(G=np.eye(2), uniforms=np.array([0.2, 0.7]), c=1.0)
    kw.update(bad)
    with pytest.raises(InputError):
        wd.walk_diagnostics(**kw)


@pytest.mark.parametrize("bad", [
    dict(K=np.ones((4, 2)).astype(np.int64)), dict(V=np.ones((3, 2))), dict(K=np.full((4, 2), np.inf)),
    dict(temp=-1.0), dict(const=-0.5), dict(beta=math.nan), dict(centre=1), dict(scale=-1.0),
    dict(rng=None), dict(uniforms=np.full(4, 0.5)), dict(delta=0.0), dict(K=np.full((4, 2), 1e200)),
])
def test_block_diagnostics_refuses_bad_input(bad):
    kw = dict(K=np.ones((4, 2)), V=np.ones((4, 2)), rng=np.random.default_rng(0))
    kw.update(bad)
    if "uniforms" in bad:         # both rng and uniforms given
        kw["rng"] = np.random.default_rng(0)
    if bad.get("rng", 0) is None:
        kw.pop("uniforms", None)
    with pytest.raises(InputError):
        wd.block_diagnostics(**kw)


def test_first_level_blocks_and_key_geometry():
    rng = np.random.default_rng(8)
    K, V = rng.standard_normal((2, 23, 4)), rng.standard_normal((2, 23, 3))
    Kb, Vb = wd.first_level_blocks(K, V, block_size=4, sink=2, window=3)       # middle of 18: 4 full blocks
    assert Kb.shape == (2, 4, 4, 4) and Vb.shape == (2, 4, 4, 3)
    assert np.array_equal(Kb[1, 2], K[1, 10:14]) and np.array_equal(Vb[0, 3], V[0, 14:18])
    # keys 0, e1, 2 e1 at scale 1: energies 0, 1, 4 (median 1), half squared distances 1/2, 2, 1/2 (median 1/2)
    k = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    geo = wd.key_geometry(k, scale=1.0)
    assert geo["key_energy"] == 1.0 and geo["key_distance"] == 0.5
    cen = wd.key_geometry(k, scale=1.0, centre=True)                           # centred: -1, 0, 1
    assert cen["key_energy"] == 1.0 and cen["key_distance"] == 0.5
    alive = np.array([True, False, True])
    assert wd.key_geometry(k, scale=1.0, alive=alive)["key_distance"] == 2.0
    s = wd.summarize_diagnostics(wd.block_diagnostics(Kb, Vb, rng=rng))
    assert s["blocks"] == 8 and s["offdiag_share"]["min"] <= s["offdiag_share"]["median"] <= s["offdiag_share"]["max"]
    with pytest.raises(InputError):
        wd.first_level_blocks(K, V, block_size=4, sink=20, window=4)


def test_blockwise_walk_cause():
    K, V, rng = _unit_blocks(9, lead=(2,), n=40)
    out = wd.blockwise_walk_cause(K, V, block_size=8, sink=2, window=6, rng=rng)     # 32 middle tokens: 4 blocks
    assert set(out) == set(wd.KERNELS)
    for kern in out.values():
        assert kern["raw"]["blocks"] == kern["centred"]["blocks"] == 8
    assert "released_disc_ratio" in out["released-t0.1"]["raw"] and "released_disc_ratio" not in out["balance"]["raw"]
    with pytest.raises(InputError):
        wd.blockwise_walk_cause(K, V, block_size=64, rng=rng)                      # no full block
    with pytest.raises(InputError):
        wd.blockwise_walk_cause(K, V, block_size=8, rng=rng, kernels=("nope",))
