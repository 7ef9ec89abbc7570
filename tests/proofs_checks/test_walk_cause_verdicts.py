"""What the walk has to balance, in the BalanceKV checks' verdicts: the words from the measured numbers
(proofs_checks.walk_cause) and their place in the verdicts (cheap: synthetic summaries, no model)."""
from __future__ import annotations

from kvbounds.proofs_checks import walk_cause as wc
from kvbounds.core import Record


def leaf(off, greedy, same=1.0, own=None, blocks=4, query=None):
    """One side's summary; ``query``: (walk's numerator, denominator, greedy's numerator, random's numerator) as means
    over blocks (None: no held-out queries measured)."""
    s = lambda x: dict(median=x, min=x, max=x, mean=x)
    out = dict(offdiag_share=s(off), greedy_disc_ratio=s(greedy), theorem_equal_random=s(same),
               theorem_disc_ratio=s(own if own is not None else 1.0), released_equal_random=s(0.5),
               released_disc_ratio=s(greedy), blocks=blocks)
    if query is not None:
        num, den, gnum, rnum = query
        for rule in ("theorem", "released"):
            out.update({f"{rule}_query_num": s(num), f"{rule}_query_den": s(den)})
        out.update(greedy_query_num=s(gnum), greedy_query_den=s(gnum), random_query_num=s(rnum),
                   random_query_den=s(rnum))
    return out


def test_the_cause_in_the_query_sides_terms():
    """Where held-out queries were measured, the sentence states what they see (numerator, denominator, greedy) and
    the Gram yardstick beside it; the coin comes first (its signs are random signs')."""
    coin = wc.sentence(leaf(1e-6, 1.0, query=(1.0, 0.98, 0.61, 1.0)))
    assert coin == ("the theorem's c makes the walk a coin (100% of signs equal random signs): held-out queries see "
                    "1.00 of random signs' discrepancy (numerator; denominator 0.98: a draw of random signs), where "
                    "greedy would reach 0.61 (denominator 0.61); the Gram yardstick reads 1.00 (greedy's 1.00)")
    balances = wc.sentence(leaf(1e-6, 1.0, query=(0.61, 0.45, 0.6, 0.97)), walk="released")
    assert balances == ("the released walk balances what held-out queries see: 0.61 of random signs' discrepancy "
                        "(numerator; denominator 0.45; greedy 0.60); the Gram yardstick reads 1.00 (greedy's 1.00)")
    assert wc.sentence(leaf(0.5, 0.66, query=(0.95, 0.9, 0.62, 1.0)), walk="released") == (
        "the released walk does not balance what held-out queries see (0.95 of random signs'; greedy would reach "
        "0.62); the Gram yardstick reads 0.66 (greedy's 0.66)")
    assert "nor does greedy, 0.97" in wc.sentence(leaf(0.5, 0.9, query=(0.99, 0.9, 0.97, 1.0)), walk="released")
    both = wc.cause_text(dict(raw=leaf(1e-6, 1.0, query=(1.0, 1.0, 0.9, 1.0)),
                              centred=leaf(1e-6, 1.0, query=(1.0, 1.0, 0.61, 1.0))))
    assert "where greedy would reach 0.90" in both and "; with the released code's key centring: " in both
    assert both.endswith("where greedy would reach 0.61 (denominator 0.61); the Gram yardstick reads 1.00 (greedy's "
                         "1.00)")


def test_without_queries_the_sentence_names_the_gram_yardstick():
    coin = wc.sentence(leaf(1e-6, 0.99))
    assert coin == ("the theorem's c makes the walk a coin (100% of signs equal random signs); the Gram yardstick: "
                    "greedy keeps 0.99 of random signs' discrepancy (off-diagonal share 1e-06; no held-out queries "
                    "measured here)")
    assert wc.sentence(leaf(1e-6, 0.99), walk="released").startswith(
        "the Gram yardstick sees nothing for the released walk to balance (greedy keeps 0.99")
    assert wc.sentence(leaf(0.9, 0.15, same=0.6, own=0.3)).startswith("the walk keeps 0.30 of random signs' Gram")
    assert "nothing to balance at these norms" not in coin
    assert wc.sentence(None) == "not measured" == wc.cause_text(None)


def test_merge_over_streams_takes_the_median_of_medians_the_extremes_and_the_weighted_mean():
    m = wc.merge([leaf(0.1, 0.2), leaf(0.3, 0.4), leaf(0.5, 0.9, blocks=8)])
    assert m["offdiag_share"] == dict(median=0.3, min=0.1, max=0.5, mean=(0.1 * 4 + 0.3 * 4 + 0.5 * 8) / 16)
    assert m["blocks"] == 16
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
    assert len(f) == 1 and "real SmolLM2: the theorem's c makes the walk a coin" in f[0].detail
    assert "the Gram yardstick: greedy keeps 1.00" in f[0].detail and "nothing to balance at" not in f[0].detail
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
    assert "layer 0: the theorem's c makes the walk a coin (100% of signs equal random signs); the Gram yardstick: " \
           "greedy keeps 0.86" in v.summary
    assert "layers 1 and up: the theorem's c makes the walk a coin (100% of signs equal random signs); the Gram " \
           "yardstick: greedy keeps 1.00 of random signs' discrepancy (off-diagonal share 0.0001" in v.summary


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


def test_vs_uniform_sentences_read_the_records():
    """BKV.vs-uniform's verdict states the cause and the walk's share in numbers read from its records: the query
    side's means (merged over the layer's records) and each comparison's median ratio over the text windows."""
    import numpy as np
    from kvbounds.proofs_checks import bkv_vs_uniform as bu, bkv_walk_share as ws
    from kvbounds.proofs_checks.common import make_record
    p = dict(trace="synthetic:gaussian:256:16:0", T=1, sink=16, window=16, block_size=32, seeds=3, fallback="test")
    wc._BLOCKWISE.clear()
    cells = bu.run_trial(p, 1, "numpy")
    rng = np.random.default_rng(0)
    share = []
    for i in range(12):                      # 12 texts: calls are made (>= 10 units)
        walk = 0.1 + 0.01 * rng.random()
        arms = {ws.ARMS[0]: walk, ws.ARMS[1]: walk * 1.25, ws.ARMS[2]: walk * 0.98, ws.ARMS[3]: walk * 1.02}
        share.append(make_record("BKV.vs-uniform", dict(sweep=ws.SWEEP, index=i, T=2, length=384, window=32,
                                                        layers=[2, 14], text=f"topic:t{i}"),
                                 measured=arms[ws.ARMS[0]], bound=arms[ws.ARMS[1]], check=ws.CHECK, arms=arms,
                                 weight_sum=dict(walk=0.95, coin=0.9), seeds_per_unit=4))
    v = bu.summarize(cells + share)
    rel = next(r for r in cells if r.check == "error released-t1").extra["walk_cause"]["centred"]
    expect = wc.sentence(rel, walk="released")
    assert f"{rel['released_query_num']['mean']:.2f} of random signs'" in expect and expect in v.summary
    assert "nothing to balance at these norms" not in v.summary
    calls = {c["comparison"]: c for c in ws.share_calls(share)}
    ablation = calls[ws.COMPARISONS[0][2]]
    assert ablation["call"] == "better" and abs(ablation["effect"] - 0.8) < 1e-8
    assert (f"T = 2: better ({ablation['effect']:.3g} [{ablation['ci'][0]:.3g}, {ablation['ci'][1]:.3g}], "
            "12/12 windows lower)") in v.summary
    assert "the released estimator's middle weights sum to 0.95-0.95 of the middle's tokens with the walk" in v.summary
    share_finding = [f for f in v.findings if f.title.startswith("the released walk's win over its ablation")]
    assert len(share_finding) == 1 and ("12 independent units: distinct texts, the first 384 tokens of each"
                                     in share_finding[0].detail)
