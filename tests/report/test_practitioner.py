"""The practitioner's table (kvbounds.report) from hand-made leaderboard rows: the better standard baseline
chosen per task and budget, the one rule's paired call per instance (kvbounds.verdict), the (method, budget) not
run said in words, decode error called by the decode claim's own call, compression time per token beside the
prefill's."""
from __future__ import annotations

import numpy as np

from kvbounds.report._practitioner import comparison, markdown_lines, practitioner_table
from kvbounds.verdict import Verdict

NLL = "ppl: NLL increase vs exact (nats/token)"
HIT = "passkey: exact match"
DECODE = "decode: relative attention error of the generated tokens' queries, SmolLM2 generating"
N = 12                              # instances (the unit: a distinct prompt or text window)


def row(method, metric, budget, values, family="baselines"):
    x = np.asarray(values, float)
    return dict(method=method, metric=metric, budget=budget, value=float(x.mean()), ci_low=float(x.min()),
                ci_high=float(x.max()), n=len(x), family=family, note="",
                units={f"instance {i}": float(v) for i, v in enumerate(x)})


def spread(center, width=0.02):
    return center + width * np.linspace(-1, 1, N)


def board() -> list[dict]:
    return [row("exact", NLL, 1.0, np.zeros(N)), row("exact", HIT, 1.0, np.ones(N)),
            row("streaming_llm", NLL, 0.25, spread(0.12)), row("uniform", NLL, 0.25, spread(0.3)),
            row("balancekv", NLL, 0.25, spread(0.5), "ours"), row("kcenter", NLL, 0.25, spread(0.12, 0.2), "ours"),
            row("uniform", HIT, 0.25, np.zeros(N)), row("streaming_llm", HIT, 0.25, np.r_[np.ones(2), np.zeros(N - 2)]),
            row("balancekv", HIT, 0.25, np.zeros(N), "ours"),
            row("uniform", NLL, 0.5, spread(0.1)), row("kcenter", NLL, 0.5, spread(0.05), "ours"),
            row("streaming BalanceKV", DECODE, 0.33, [0.02], "ours"),
            row("control: uniform sample (the press's sink and window exact)", DECODE, 0.33, [0.05]),
            row("control: StreamingLLM (the press's sink and the most recent tokens)", DECODE, 0.33, [0.09])]


def test_the_table_calls_each_method_against_the_better_baseline():
    timing = [dict(method="balancekv", n=512, compress_s=0.0512, prefill_s=1.024, score_s=0.1, count=4)]
    decode_call = dict(family="SmolLM2 greedy decode", control="uniform", call="not attainable", n=1, wins=1,
                       effect=0.4, ci=[0.0, float("inf")], smallest_p=1.0, metric="practitioner", scale="ratio")
    decode = Verdict("BKV.decode", "", "s", variant="variant measured: streaming press",
                     power_calls=[dict(decode_call, metric="theorem", call="better"), decode_call])
    t = practitioner_table(board(), {"BKV.decode": decode}, timing)
    rows = {(r["method"], r["task"].split(":")[0], r["budget"]): r for r in t["rows"]}
    bkv = rows[("balancekv", "perplexity", "25%")]
    assert bkv["baseline"] == "StreamingLLM" and bkv["call"] == "worse"       # 12/12 instances 0.38 nats worse
    assert bkv["comparison"]["n"] == N and bkv["comparison"]["wins"] == 0 and bkv["comparison"]["scale"] == "difference"
    assert abs(bkv["comparison"]["effect"] - 0.38) < 1e-9 and bkv["exact"]["value"] == 0.0
    assert abs(bkv["compress_ms"] - 0.1) < 1e-12 and abs(bkv["prefill_ms"] - 2.0) < 1e-12
    assert rows[("kcenter", "perplexity", "25%")]["call"] == "tied"          # the same mean, a wider spread
    assert rows[("kcenter", "perplexity", "50%")]["baseline"] == "uniform"   # the only baseline run at 50%
    assert rows[("kcenter", "perplexity", "50%")]["call"] == "better"
    hit = rows[("balancekv", "passkey", "25%")]
    assert hit["baseline"] == "StreamingLLM" and hit["call"] == "tied"      # 2 of 12 instances differ: p = 0.5
    dec = rows[("streaming BalanceKV", "decode", "33%")]     # the decode claim's call on the practitioner's metric
    assert dec["baseline"] == "uniform" and dec["call"] == "not attainable" and dec["compress_ms"] is None
    assert t["not_run"] == ["at 50% of the cache: balancekv not run on this profile"]
    text = "\n".join(markdown_lines(t))
    assert ("| balancekv | perplexity: NLL increase vs exact (nats/token) | 25% | 0.5 [0.48, 0.52] | 0 | StreamingLLM "
            "0.12 [0.1, 0.14] | **worse** (+0.38 [+0.38, +0.38], 0/12 wins) | 0.1 / 2 |") in text
    assert "Not run: at 50% of the cache: balancekv not run on this profile." in text
    assert "Holm over 4 at 0.05" in text and "at the unit (an instance: a distinct prompt or text window)" in text
    assert t["in_words"].startswith("At 25% of the memory, of 3 (method, task) comparisons with the better of "
                                    "StreamingLLM and uniform sampling: 2 tied, 1 worse; worse: "
                                    "balancekv (perplexity).")
    assert "At 50% of the memory, of 1 (method, task) comparisons" in t["in_words"]


def test_a_comparison_pairs_the_shared_instances_and_says_why_not():
    a, b = row("m", NLL, 0.25, [0.1, 0.2, 0.3]), row("b", NLL, 0.25, [0.2, 0.2])
    c = comparison(a, b, NLL, "m | ppl | 25%", "uniform")
    assert list(c.method) == [0.1, 0.2] and list(c.baseline) == [0.2, 0.2] and not c.reason
    assert c.scale == "difference" and c.lower_is_better and c.threshold == 0.01
    assert comparison(dict(a, units={}), b, NLL, "x", "uniform").reason == "no per-instance scores in these rows"
    assert practitioner_table(None) is None and practitioner_table([]) is None
    assert markdown_lines(None)[0].startswith("No end-to-end records")


def test_a_norm_in_the_task_does_not_break_the_markdown_table():
    t = practitioner_table(board(), {}, [])
    line = next(x for x in markdown_lines(t) if x.startswith("| streaming BalanceKV"))
    assert line.count("|") - line.count("\\|") == 9                     # 8 cells
