"""The INDEX construction of 001 App. C.1 (claim LB.index), Bob's decoder, the game, the compressor adapters."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy import stats

from kvbounds.algorithms.attention import exact_attention
from kvbounds.algorithms.compressor_adapters import make_compressor, play, subgen_class
from kvbounds.algorithms.index_reduction import (DECODERS, SlotBatch, bob_decode, bob_value, build_instance, collisions,
                                        decode_group, draw_public_coins, draw_slot_batch, eq2_error, group_attention,
                                        lemma_sum, random_instance)
from kvbounds.algorithms.validation import InputError
from kvbounds.theory.lower_bound import bob_threshold

sizes = st.tuples(st.integers(1, 6), st.integers(1, 5), st.sampled_from([0.25, 0.5, 1.0]), st.integers(0, 2**16))


@given(sizes)
def test_group_structure_and_values(args):
    d, G, frac, seed = args
    r = math.sqrt(frac * d)
    inst = random_instance(G * d, d, r, np.random.default_rng(seed))
    part = inst.coins.partition
    for g in range(G):                     # every group: d bits, one per coordinate
        members = np.flatnonzero(part[:, 0] == g)
        assert len(members) == d and sorted(part[members, 1]) == list(range(d))
        assert np.all(inst.keys[members] == inst.coins.keys_tilde[g])   # one key per group
    V = inst.values
    assert np.all((V != 0).sum(1) == 1)                                 # one non-zero per value ...
    assert np.all(V[np.arange(inst.n), part[:, 1]] == inst.coins.signs)  # ... sigma_i at pi(i)_2
    np.testing.assert_allclose(np.linalg.norm(inst.keys, axis=1), r)
    assert set(np.unique(inst.coins.keys_tilde * math.sqrt(d) / r)) <= {-1.0, 1.0}
    idx, K, Vu = inst.stream()
    assert np.array_equal(idx, np.flatnonzero(inst.bits)) and len(K) == len(Vu) == inst.u_size


def test_u_size_is_binomial():
    rng = np.random.default_rng(0)
    n, d, reps = 32, 8, 3000
    u = np.array([random_instance(n, d, 2.0, rng).u_size for _ in range(reps)])
    observed = np.bincount(u, minlength=n + 1)
    expected = stats.binom.pmf(np.arange(n + 1), n, 0.5) * reps
    keep = expected > 5
    chi2 = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    assert stats.chi2.sf(chi2, keep.sum() - 1) > 1e-3
    b = draw_slot_batch(reps, n, d, 2.0, rng)
    assert abs(b.bits.sum((1, 2)).mean() - n / 2) < 5 * math.sqrt(n / 4 / reps)


def test_bad_parameters_raise():
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match="r\\^2"):
        random_instance(8, 4, 2.5, rng)
    with pytest.raises(InputError, match="multiple of d"):
        random_instance(10, 4, 1.0, rng)
    with pytest.raises(InputError, match="multiple of d"):
        draw_slot_batch(3, 10, 4, 1.0, rng)
    coins = draw_public_coins(8, 4, 1.0, rng)
    with pytest.raises(InputError, match="0/1"):
        build_instance(np.full(8, 2), coins)
    with pytest.raises(InputError, match="shape"):
        build_instance(np.ones(7), coins)
    inst = build_instance(np.ones(8), coins)
    with pytest.raises(InputError, match="decoder"):
        bob_value(np.zeros(4), 0, inst, "other")
    with pytest.raises(InputError, match="bit index"):
        inst.query(8)
    with pytest.raises(InputError, match="rng"):
        draw_public_coins(8, 4, 1.0, 0)
    b = draw_slot_batch(2, 8, 4, 1.0, rng)
    att = group_attention(b)
    with pytest.raises(InputError, match="direction"):
        eq2_error(b, att, 0.1, "sideways", rng)
    with pytest.raises(InputError, match="eps"):
        eq2_error(b, att, -1.0, "random", rng)


def _slot_batch(inst, i):
    ks, bits, sig = inst.slots()
    g, c = inst.coins.partition[i]
    return SlotBatch(inst.d, inst.r, ks[None], bits[None], sig[None], np.array([g]), np.array([c]))


@given(sizes)
def test_slot_form_matches_the_instance(args):
    d, G, frac, seed = args
    rng = np.random.default_rng(seed)
    inst = random_instance(G * d, d, math.sqrt(frac * d), rng)
    if inst.u_size == 0:
        return
    i = int(rng.integers(inst.n))
    _, K, V = inst.stream()
    q = inst.query(i)
    z = exact_attention(q, K, V)
    b = _slot_batch(inst, i)
    att = group_attention(b)
    np.testing.assert_allclose(att.z[0], z, atol=1e-12)
    logits = K @ q / math.sqrt(d)
    np.testing.assert_allclose(att.D[0], np.exp(logits).sum(), rtol=1e-12)
    np.testing.assert_allclose(att.sq[0], np.exp(2 * logits).sum(), rtol=1e-12)
    # the lemma sum and |U_i| by brute force over U
    np.testing.assert_allclose(lemma_sum(b, att)[0], (np.exp(logits) * (V @ inst.values[i])).sum(), rtol=1e-10, atol=1e-12)
    c = inst.coordinate(i)
    brute_ui = sum(1 for j in np.flatnonzero(inst.bits) if j != i and inst.coordinate(j) == c)
    assert collisions(b)[0] == brute_ui
    for rule in DECODERS:
        assert decode_group(b, att.z, att.u, rule)[0, c] == bob_decode(z, i, inst, rule)


def test_corollary_c5_identity_on_instances():
    rng = np.random.default_rng(3)
    for _ in range(20):
        inst = random_instance(48, 6, 2.0, rng)
        U = np.flatnonzero(inst.bits)
        for g in range(inst.coins.groups):
            members = np.flatnonzero(inst.coins.partition[:, 0] == g)
            total = sum(sum(1 for j in U if j != i and inst.coordinate(j) == inst.coordinate(i)) for i in members)
            assert total == len(U) - inst.bits[members].sum() <= len(U)


def test_group_attention_backends_agree(backend):
    b = draw_slot_batch(50, 64, 16, 4.0, np.random.default_rng(5))
    ref, got = group_attention(b, "numpy"), group_attention(b, backend)
    np.testing.assert_allclose(got.z, ref.z, atol=1e-12)
    np.testing.assert_allclose(got.D, ref.D, rtol=1e-12)


def test_one_group_decodes_perfectly_and_literal_rule_fails():
    rng = np.random.default_rng(7)
    b = draw_slot_batch(2000, 16, 16, 4.0, rng)
    att = group_attention(b)
    idx = np.arange(b.R)
    truth = b.bits[idx, b.group]
    for rule in ("abs", "signed"):
        assert np.array_equal(decode_group(b, att.z, att.u, rule), truth)
    lit = decode_group(b, att.z, att.u, "literal")
    sig = b.signs[idx, b.group]
    assert not lit[truth & (sig < 0)].any()          # a 1-bit with sigma = -1 reads negative: decoded 0
    assert 0.7 < (lit == truth).mean() < 0.8


def test_empty_u_is_decoded_as_zero():
    b = draw_slot_batch(4000, 4, 4, 1.0, np.random.default_rng(1))
    att = group_attention(b)
    empty = att.u == 0
    assert empty.any() and np.all(att.z[empty] == 0) and np.all(att.softmax_norm[empty] == 0)
    assert not decode_group(b, att.z, att.u)[empty].any()


@pytest.mark.parametrize("direction", ["random", "adversarial", "clairvoyant"])
def test_eq2_error_has_exactly_the_allowed_size(direction):
    rng = np.random.default_rng(2)
    b = draw_slot_batch(200, 64, 16, 4.0, rng)
    att = group_attention(b)
    e = eq2_error(b, att, 0.3, direction, rng)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 0.3 * att.softmax_norm * np.sqrt(att.u), rtol=1e-12)
    if direction == "adversarial":       # spread evenly, each coordinate pushed away from the truth
        np.testing.assert_allclose(np.abs(e), np.abs(e[:, :1]) * np.ones((1, 16)), rtol=1e-12)
    if direction == "clairvoyant":
        assert np.count_nonzero(e, axis=1).max() == 1 and np.all(e[np.arange(200), b.coord] != 0)


def test_adversarial_error_flips_bits_once_eps_sqrt_n_is_large():
    rng = np.random.default_rng(4)
    b = draw_slot_batch(400, 1024, 64, 8.0, rng)
    att = group_attention(b)
    idx = np.arange(b.R)
    acc = []
    for eps in (0.001 / 32, 1.0 / 32):
        z = att.z + eq2_error(b, att, eps, "adversarial", rng)
        acc.append((decode_group(b, z, att.u)[idx, b.coord] == b.truth).mean())
    assert acc[0] > 0.95 and acc[1] < 0.6


def test_threshold_matches_theory():
    inst = random_instance(32, 16, 4.0, np.random.default_rng(0))
    z = np.zeros(16)
    i = int(np.flatnonzero(inst.bits)[0])
    c = inst.coordinate(i)
    thr = bob_threshold(16, 4.0, inst.u_size)
    z[c] = thr * 1.01 * inst.coins.signs[i]
    assert bob_decode(z, i, inst, "signed") == 1 and bob_decode(z, i, inst, "abs") == 1
    z[c] = thr * 0.99
    assert bob_decode(z, i, inst, "abs") == 0


@pytest.mark.parametrize("name", ["uniform", "blockwise", "balancekv", "subgen"])
def test_adapters_run_and_full_memory_is_exact(name):
    if name == "subgen" and subgen_class() is None:
        pytest.skip("algorithms/subgen.py is not importable")
    rng = np.random.default_rng(11)
    inst = random_instance(128, 16, 4.0, rng)
    _, K, V = inst.stream()
    comp = make_compressor(name, 5, d=16, r=4.0, u_size=inst.u_size, seed=1)
    comp.consume(K, V)
    q = inst.query(0)
    z = np.asarray(comp.query(q))
    assert z.shape == (16,) and np.isfinite(z).all()
    assert 0 < comp.num_stored() and comp.state_bits(inst.n) > 0
    if name in ("uniform", "blockwise"):      # setting 5 keeps all of U
        np.testing.assert_allclose(z, exact_attention(q, K, V), atol=1e-12)


def test_play_and_clairvoyant_control():
    rng = np.random.default_rng(12)
    res = play("uniform", 5, 128, 16, 4.0, 6, rng)
    assert set(res) == {"correct", "group_accuracy", "stored", "state_bits"} and len(res["correct"]) == 6
    ctl = play("clairvoyant", 0, 128, 16, 4.0, 20, rng)
    assert ctl["correct"].all() and ctl["stored"].max() <= 1
    with pytest.raises(InputError):
        make_compressor("nope", 1, d=16, r=4.0, u_size=10, seed=0)
