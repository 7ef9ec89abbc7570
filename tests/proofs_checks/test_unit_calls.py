"""Calls at the unit of replication (issue 45 item 1): records of one text count once, however many (layer, head)
cells or seeds they hold; SUB.lowrank's falsifier 2, BKV.ablation's doubling steps and BKV.vs-uniform's variants
are the one rule's calls over texts (kvbounds.verdict.paired_calls)."""
import numpy as np

from kvbounds.proofs_checks import sub_lowrank
from kvbounds.proofs_checks.common import make_record


def _f2_records(texts: int, cells: int = 12, shift: float = -0.02):
    """Falsifier 2's records: adaptive's error ``shift`` below static's in every (layer, head) cell of each text."""
    rng = np.random.default_rng(3)
    out = []
    for t in range(texts):
        trace = f"smollm2:L2:2048" if texts == 1 else f"synthetic:low_rank:2048:64:{t}"
        for c in range(cells):
            for r in (8, 16):
                st = 0.2 + 0.01 * rng.random()
                out.append(make_record("SUB.lowrank", dict(kind="spectra", trace=trace, layer=c // 4, head=c % 4, r=r),
                                       measured=st * (1 + shift), bound=st, bound_kind="exact",
                                       check="F2 adaptive vs static", n=2048, model="smollm2"))
    return out


def test_falsifier_2_counts_a_text_once_not_its_heads():
    """Falsifier 2 (adaptive no worse than static) is the one rule's call at the unit, a text: the 12 (layer, head)
    cells of one text are one unit, so "not attainable" and the row "not-shown", however many cells agree (the
    Wilcoxon over cells it replaced called them 12 independent units); on 12 distinct texts adaptive 2% lower in
    every one is a tie (inside the 5% practical threshold): the falsifier is cleared, not fired."""
    one = sub_lowrank._falsifier_2(_f2_records(1))
    assert one.status == "not-shown" and one.detail.count("not attainable (smallest p") == 2
    assert "lower in 12/12 (layer, KV head) cells" in one.detail and "the unit a text (1 here" in one.detail
    many = sub_lowrank._falsifier_2(_f2_records(12))
    assert many.status == "reproduced" and many.detail.count("-> tied") == 2
    worse = sub_lowrank._falsifier_2(_f2_records(12, shift=0.3))
    assert worse.status == "reversed" and worse.detail.count("-> worse") == 2


def test_bkv_ablation_steps_count_a_text_once_not_its_seeds():
    """BKV.ablation's doubling steps (and BKV.vs-uniform's variants) are called by the one rule at the unit, a text:
    the seeds' mean per (text, layer) record, the layers of one text one unit (the Mann-Whitney over seeds it
    replaced counted 10 seeds of one text as 10 units). One text: not attainable, the row not-shown; 12 texts with
    the error 20% lower at every one: better, reproduced; a step whose runtime did not rise never counts."""
    from kvbounds.proofs_checks import bkv_variants as bv

    def recs(texts):
        return [make_record("BKV.ablation", dict(trace=f"smollm2:L{l}:2048", T=1, block_size=128),
                            measured=0.08 + 0.001 * t, bound=0.1 + 0.00125 * t, check="error balance",
                            unit=f"text {t}" if texts > 1 else None)
                for t in range(texts) for l in (1, 15)]
    one = bv.step_calls([("T = 1, b 64 -> 128", "b = 64", recs(1))])
    assert one[0]["call"] == "not attainable" and one[0]["n"] == 1
    assert bv.reproduction("balance", one, "setup").status == "not-shown"
    many = bv.step_calls([("T = 1, b 64 -> 128", "b = 64", recs(12))])
    assert many[0]["call"] == "better" and many[0]["n"] == 12 and abs(many[0]["effect"] - 0.8) < 1e-9
    assert bv.reproduction("balance", many, "setup").status == "reproduced"
    assert bv.reproduction("balance", many, "setup", gates=[False]).status != "reproduced"
