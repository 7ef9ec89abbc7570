"""What the walk has to balance, in the BalanceKV checks' verdicts: the words from the measured numbers
(proofs_checks.walk_cause) and their place in the verdicts (cheap: synthetic summaries, no model)."""
from __future__ import annotations

from kvbounds.proofs_checks import walk_cause as wc
from kvbounds.core import Record


def leaf(off, greedy, same=1.0, own=None, blocks=4):
    s = lambda x: dict(median=x, min=x, max=x)
    out = dict(offdiag_share=s(off), greedy_disc_ratio=s(greedy), theorem_equal_random=s(same),
               theorem_disc_ratio=s(own if own is not None else 1.0), released_equal_random=s(0.5),
               released_disc_ratio=s(greedy), blocks=blocks)
    return out


def test_the_two_causes_and_a_walk_that_balances_in_words():
    nothing = wc.sentence(leaf(1e-6, 0.99))
    assert nothing == ("the walk has nothing to balance at these norms (off-diagonal share 1e-06, greedy keeps 0.99 of "
                       "random signs' discrepancy)")
    coin = wc.sentence(leaf(0.9, 0.15, same=1.0))
    assert coin.startswith("the theorem's c makes the walk a coin (100% of signs equal random signs) although greedy "
                           "reaches 0.15")
    assert wc.sentence(leaf(0.9, 0.15, same=0.6, own=0.3)).startswith("the walk balances: it keeps 0.30")
    assert wc.sentence(leaf(0.9, 0.4), walk="released").startswith("the released walk balances: it keeps 0.40")
    both = wc.cause_text(dict(raw=leaf(1e-6, 0.99), centred=leaf(1e-5, 0.98)))
    assert both.startswith(nothing + "; with the released code's key centring: the same (off-diagonal share 1e-05")
    assert wc.sentence(None) == "not measured" == wc.cause_text(None)


def test_merge_over_streams_takes_the_median_of_medians_and_the_extremes():
    m = wc.merge([leaf(0.1, 0.2), leaf(0.3, 0.4), leaf(0.5, 0.9)])
    assert m["offdiag_share"] == dict(median=0.3, min=0.1, max=0.5) and m["blocks"] == 12
    assert wc.merge([]) is None and wc.merge_sides([{}]) is None


def test_bkv_attention_names_the_cause_per_family_on_its_card():
    from kvbounds.proofs_checks import bkv_attention as ba
    from kvbounds.streams import power_record
    recs = []
    for fam, cause in (("real SmolLM2", leaf(1e-3, 1.0)), ("synthetic benign", leaf(0.96, 0.12))):
        for rep in range(3):
            r = power_record(ba.CLAIM, dict(family=fam, rep=rep, sweep="power", n=256, t=32), ba.SOURCE, 0.1,
                             dict(zeros=0.3, uniform=0.05))
            r.extra["walk_cause"] = dict(raw=cause, centred=cause, walks=3, replayed=True)
            recs.append(r)
    v = ba.summarize(recs)
    f = [f for f in v.findings if f.title.startswith("what the walk has to balance")]
    assert len(f) == 1 and "real SmolLM2: the walk has nothing to balance" in f[0].detail
    assert "synthetic benign: the theorem's c makes the walk a coin" in v.summary
    assert isinstance(recs[0], Record)


def test_bkv_decode_separates_the_first_layer_from_the_rest():
    import math
    from kvbounds.proofs_checks import bkv_decode
    from kvbounds.proofs_checks.decode_stream import trial_params
    from kvbounds.proofs_checks.decode_verdict import build_records
    heads = [dict(err=0.01, units={"F": 1.0}, cert=1.0, r=5.0, kmax=5.0, vmax=1.0, qnorm=4.0,
                  controls=dict(zeros=0.9, uniform=0.05)) for _ in range(2)]
    rows = [dict(n=n, layer=layer, stored=32, d=64, heads=heads) for n in (96, 128) for layer in range(3)]
    recs = build_records(bkv_decode.CLAIM, "src", trial_params("quick"), rows, "F", lambda row, h: math.log(0.5))
    for r in recs:
        if r.check == "trivial controls":
            c = leaf(0.2, 0.86) if r.params["layer"] == 0 else leaf(1e-4, 1.0)
            r.extra["walk_cause"] = dict(raw=c, centred=c, walks=2, replayed=True)
    v = bkv_decode.summarize(recs)
    assert "layer 0: the walk has nothing to balance" not in v.summary
    assert "layer 0: the theorem's c makes the walk a coin" in v.summary
    assert "layers 1 and up: the walk has nothing to balance at these norms (off-diagonal share 0.0001" in v.summary


def test_blockwise_cause_is_the_same_for_every_trial_of_a_layer():
    """The uniforms are seeded from the trace and the layout, not the trial: BKV.vs-uniform's trials of one layer
    (one per T, each with its own seed) store the same numbers, whichever runs first in a process."""
    import numpy as np
    rng = np.random.default_rng(0)
    K, V = rng.standard_normal((2, 96, 8)), rng.standard_normal((2, 96, 8))
    kw = dict(block_size=16, sink=8, window=8, kernels=("balance", "released-t1"))
    wc._BLOCKWISE.clear()
    a = wc.blockwise_cause("t:L1", K, V, **kw)
    wc._BLOCKWISE.clear()
    wc.blockwise_cause("t:L2", K[:, ::-1], V, **kw)
    b = wc.blockwise_cause("t:L1", K, V, **kw)
    assert a == b and set(a) == {"balance", "released-t1"} and a["balance"]["raw"]["blocks"] == 2 * 5
