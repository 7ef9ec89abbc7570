"""Issue 21's time savings keep the results: one prefill serves both settings of an instance (the question-after
prompt is a prefix of the papers' one), and compressed caches scored in one batch equal those scored one by one."""
import numpy as np


def test_sliced_prefill_equals_its_own_prefill(lm):
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    after, inside = tasks.passkey_task(lm, 128, 1000), tasks.passkey_task(lm, 128, 1000, "inside")
    assert np.array_equal(inside.context[:len(after.context)], after.context)
    full = harness.prefill(lm, inside.context)
    cut, own = harness.slice_prefill(full, len(after.context)), harness.prefill(lm, after.context)
    for a, b in zip(cut.keys + cut.values, own.keys + own.values):
        assert a.shape == b.shape and float((a - b).abs().max()) < 1e-4
    assert cut.attn_kwargs[3]["hidden_states"].shape == own.attn_kwargs[3]["hidden_states"].shape


def test_batched_scoring_equals_one_by_one(lm):
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    task = tasks.ppl_task(lm, 128, 9, 0)
    methods = ["uniform", "streaming_llm", "balancekv_released", "subgen", "kvpress:pyramidkv"]
    one, batch = harness.SCORE_BATCH, None
    try:
        harness.SCORE_BATCH = 1
        one = harness.run_cell(lm, task, methods, [0.5], sink=8, window=8)
        harness.SCORE_BATCH = 12
        batch = harness.run_cell(lm, task, methods, [0.5], sink=8, window=8)
    finally:
        harness.SCORE_BATCH = 12
    for a, b in zip(one, batch):
        assert (a["method"], a["error"]) == (b["method"], b["error"])
        if not a["error"]:
            assert np.max(np.abs(np.subtract(a["ll"], b["ll"]))) < 1e-3 and a["memory_floats"] == b["memory_floats"]


def test_both_settings_trial_gives_each_settings_records(lm):
    from kvbounds.e2e._checks import run_cell_trial
    p = dict(task="passkey", n=128, index=0, methods=["uniform", "streaming_llm"], budgets=[0.5], sink=8, window=8,
             model="smollm2", device="cpu", setting="both", block_size=128)
    recs = run_cell_trial("BKV.e2e", "test", p, 0)
    by = {}
    for r in recs:
        by.setdefault(r.params.get("setting", "after"), []).append(r)
    assert set(by) == {"after", "inside"} and len(by["after"]) == len(by["inside"]) == 3
    assert all(r.params["block_size"] == 128 and r.extra["setting"] == "inside" for r in by["inside"])
    assert all("block_size" not in r.params and r.extra["setting"] == "after" for r in by["after"])
    assert by["inside"][0].extra["n"] == by["after"][0].extra["n"] + by["after"][0].extra["task_meta"]["question_len"] - 1
