"""The practitioner's table (kvbounds.report._practitioner) from hand-made leaderboard rows: the better standard
baseline
chosen per task and budget, the interval call, the (method, budget) not run said in words, decode error called by the
battery's paired call, compression time per token beside the prefill's."""
from __future__ import annotations

from kvbounds.report._practitioner import interval_call, markdown_lines, practitioner_table
from kvbounds.verdict._rules import Verdict

NLL = "ppl: NLL increase vs exact (nats/token)"
HIT = "passkey: exact match"
DECODE = "decode: attention error / (||softmax|| ||V||_F), SmolLM2 generating"


def row(method, metric, budget, value, lo, hi, family="baselines"):
    return dict(method=method, metric=metric, budget=budget, value=value, ci_low=lo, ci_high=hi, n=8, family=family,
                note="")


def board() -> list[dict]:
    return [row("exact", NLL, 1.0, 0.0, 0.0, 0.0), row("exact", HIT, 1.0, 1.0, 0.63, 1.0),
            row("streaming_llm", NLL, 0.25, 0.12, 0.05, 0.2), row("uniform", NLL, 0.25, 0.3, 0.2, 0.4),
            row("balancekv", NLL, 0.25, 0.5, 0.4, 0.6, "ours"), row("kcenter", NLL, 0.25, 0.13, 0.0, 0.3, "ours"),
            row("uniform", HIT, 0.25, 0.0, 0.0, 0.37), row("streaming_llm", HIT, 0.25, 0.125, 0.003, 0.53),
            row("balancekv", HIT, 0.25, 0.0, 0.0, 0.37, "ours"),
            row("uniform", NLL, 0.5, 0.1, 0.0, 0.2), row("kcenter", NLL, 0.5, 0.05, 0.0, 0.1, "ours"),
            row("streaming BalanceKV", DECODE, 0.33, 0.02, 0.018, 0.022, "ours"),
            row("control: uniform sample (the press's sink and window exact)", DECODE, 0.33, 0.05, 0.04, 0.06),
            row("control: StreamingLLM (the press's sink and the most recent tokens)", DECODE, 0.33, 0.09, 0.08, 0.1)]


def test_the_table_calls_each_method_against_the_better_baseline():
    timing = [dict(method="balancekv", n=512, compress_s=0.0512, prefill_s=1.024, score_s=0.1, count=4)]
    decode = Verdict("BKV.decode", "", "s", variant="variant measured: streaming press",
                     power_calls=[dict(family="SmolLM2 greedy decode", control="uniform", call="better", n=30)])
    t = practitioner_table(board(), {"BKV.decode": decode}, timing)
    rows = {(r["method"], r["task"].split(":")[0], r["budget"]): r for r in t["rows"]}
    bkv = rows[("balancekv", "perplexity", "25%")]
    assert bkv["baseline"] == "StreamingLLM" and bkv["call"] == "worse"       # [0.4, 0.6] above [0.05, 0.2]
    assert bkv["exact"]["value"] == 0.0
    assert abs(bkv["compress_ms"] - 0.1) < 1e-12 and abs(bkv["prefill_ms"] - 2.0) < 1e-12
    assert rows[("kcenter", "perplexity", "25%")]["call"] == "not shown"     # overlapping intervals
    assert rows[("kcenter", "perplexity", "50%")]["baseline"] == "uniform"   # the only baseline run at 50%
    assert rows[("balancekv", "passkey", "25%")]["baseline"] == "StreamingLLM"   # higher match is better
    dec = rows[("streaming BalanceKV", "decode", "33%")]
    assert dec["baseline"] == "uniform" and dec["call"] == "better" and dec["compress_ms"] is None
    assert t["not_run"] == ["at 50% of the cache: balancekv not run on this profile"]
    text = "\n".join(markdown_lines(t))
    assert "| balancekv | perplexity: NLL increase vs exact (nats/token) | 25% | 0.5 [0.4, 0.6] | 0 | StreamingLLM " \
           "0.12 [0.05, 0.2] | **worse** | 0.1 / 2 |" in text
    assert "Not run: at 50% of the cache: balancekv not run on this profile." in text
    assert t["in_words"].startswith("At 25% of the memory, of 3 (method, task) comparisons with the better of "
                                    "StreamingLLM and uniform sampling, 0 are better, 1 worse and 2 not shown either "
                                    "way; worse: balancekv (perplexity).")
    assert "At 33% of the memory, of 1 (method, task) comparisons" in t["in_words"] and "is better" in t["in_words"]


def test_interval_call_and_no_records():
    a, b = dict(value=1.0, ci=[0.9, 1.1]), dict(value=2.0, ci=[1.9, 2.1])
    assert interval_call(a, b, True) == "better" and interval_call(a, b, False) == "worse"
    assert interval_call(a, dict(value=1.05, ci=[1.0, 1.2]), True) == "not shown"
    assert interval_call(a, dict(value=1.0, ci=[None, None]), True) == "not shown"
    assert practitioner_table(None) is None and practitioner_table([]) is None
    assert markdown_lines(None)[0].startswith("No end-to-end records")


def test_a_norm_in_the_task_does_not_break_the_markdown_table():
    t = practitioner_table(board(), {}, [])
    line = next(x for x in markdown_lines(t) if x.startswith("| streaming BalanceKV"))
    assert line.count("|") - line.count("\\|") == 9                     # 8 cells
