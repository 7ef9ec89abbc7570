"""kvbounds.battery.walk_probe: recording BalanceKV's walks changes nothing they do, and the recorded uniforms replay
every
walk's signs (the diagnostics are of the walks that ran)."""
import math

import numpy as np
import pytest

from kvbounds.battery import walk_probe as wp
from kvbounds.algorithms import merge_and_reduce
from kvbounds.algorithms.balance_kv import BalanceKV


def _stream(seed=0, n=160, d=6):
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((n, d))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    return K, rng.standard_normal((n, d)) / math.sqrt(d), rng.standard_normal(d)


def _run(K, V, q):
    bkv = BalanceKV(K.shape[1], batch_size=16, levels=3, eps=0.5, r=1 + 1e-9, delta=0.01, seed=3, n=K.shape[0])
    for j in range(K.shape[0]):
        bkv.update(K[j], V[j])
    return bkv.query(q), bkv.num_stored()


def test_merge_and_reduce_recorded_unchanged_and_replayed():
    K, V, q = _stream()
    original = merge_and_reduce.softmax_balance
    plain = _run(K, V, q)
    with wp.record_merge_and_reduce() as calls:
        recorded = _run(K, V, q)
    assert merge_and_reduce.softmax_balance is original
    assert np.array_equal(plain[0], recorded[0]) and plain[1] == recorded[1]
    diags = wp.merge_and_reduce_diagnostics(calls)
    assert len(diags) == len(calls) > 10 and all(d["replayed"] for d in diags)
    s = wp.summary(diags)
    assert s["walks"] == len(calls) and s["replayed"]
    # unit keys at d = 6: plenty to balance (the greedy rule halves the discrepancy or better in most cells)
    assert s["raw"]["offdiag_share"]["median"] > 0.5 and s["raw"]["greedy_disc_ratio"]["median"] < 0.5


def test_halvings_recorded_unchanged_and_replayed():
    torch = pytest.importorskip("torch")
    from kvbounds.presses._streaming import balance
    rng = np.random.default_rng(1)
    B, S, d = 3, 40, 8
    K = torch.as_tensor(rng.standard_normal((B, S, d)))
    V = torch.as_tensor(rng.standard_normal((B, S, 4)))
    logw = torch.zeros(B, S, dtype=torch.float64)

    def run():
        gen = torch.Generator().manual_seed(5)
        return balance.reduce_middle(K, V, logw, [0] * S, 12, sink=0, scale=1 / math.sqrt(d),
                                     uniform=lambda *shape: torch.rand((B, *shape), generator=gen, dtype=torch.float64))

    originals = (balance.pair_gram, balance.walk_signs)
    plain = run()
    with wp.record_halvings() as halvings:
        recorded = run()
    assert (balance.pair_gram, balance.walk_signs) == originals
    for a, b in zip(plain[:3], recorded[:3]):
        assert torch.equal(a, b)
    assert plain[3] == recorded[3]
    diags = wp.halving_diagnostics(halvings)
    assert len(diags) == len(halvings) >= 2 and all(d["replayed"] for d in diags)
    assert diags[0]["raw"]["offdiag_share"].shape == (B,)
    layers = wp.per_layer(diags, 3)                          # 3 rows = 3 "layers" of one head each
    assert len(layers) == 3 and all(s["raw"]["blocks"] == len(diags) for s in layers)
    assert layers[1]["raw"]["offdiag_share"]["max"] == max(float(d["raw"]["offdiag_share"][1]) for d in diags)
    assert wp.summary([])["walks"] == 0


def test_only_the_entering_thread_is_recorded():
    """A walk run by another thread inside the block is not recorded (and runs as always)."""
    import threading
    K, V, q = _stream(n=64)
    out = {}
    with wp.record_merge_and_reduce() as calls:
        t = threading.Thread(target=lambda: out.update(res=_run(K, V, q)))
        t.start()
        t.join()
    assert calls == [] and np.array_equal(out["res"][0], _run(K, V, q)[0])
