"""The trials of the score-vs-memory curves (:mod:`kvbounds.e2e.curves`), per profile.

One trial = one task instance: one exact prefill, then every method at every memory fraction of
:data:`CURVE_BUDGETS` compressed from it and scored (:func:`kvbounds.e2e._harness.run_cell`). Every method acts on
the finished prefill; none needs to act during it (H2O reads the attention each key received, collected while the
prefill runs; kvpress's presses read the attention inputs captured then; the streaming presses of
:mod:`kvbounds.streaming`, which do act while tokens arrive, are measured by the decode claims, not here).

Setting: the question inside the compressed prompt (the papers' and RULER's prompt: the question ends the
context, within the exact last window), so only the answer's tokens are fed after the compressed cache. The tasks
and lengths are those where exact attention solves the task (>= 90%, :data:`kvbounds.e2e.curves.POWER_FLOOR`)
for the model, measured (the report states exact attention's score on every cell; a cell below it is "no power"):

* full (20 instances a curve cell): SmolLM2 at 2048 tokens: passkey and perplexity with every method of
  :data:`CURVE_METHODS`, the single needle with :data:`RULER_METHODS`; Qwen2.5-Coder-0.5B at 2048: line retrieval
  (32 lines) with every method; every other RULER-style task on both models with exact attention alone
  (:data:`EXACT_ONLY` instances: its score, "no power" below 90%); the needle-depth x context-length sweep (SmolLM2,
  single needle, exact attention and :data:`SWEEP_METHODS` at 25% of the cache). Measured on 2 loaded cores, a
  SmolLM2 passkey instance takes 150-450 wall s, a Qwen line-retrieval instance 240-460 (a trial's fixed cost
  dominates: the model, the exact prefill with the attention inputs captured; each method's compression and
  scoring takes 0.2-3 s), so the grid is sized by its trial count (Qwen's perplexity curve left out, 3 exact-only
  instances): 122 trials.
* quick (smaller, and saying so: 4 instances a cell at 512 tokens, :data:`QUICK_METHODS`): SmolLM2 passkey and
  Qwen line retrieval (8 lines), so that the report's panels are drawn from a run of minutes.
"""
from __future__ import annotations

from kvbounds import methods as registry

from . import _method_names as N

# the papers' main variants, from the method registry: BalanceKV's pseudocode and released walk, greedy k-center and
# SubGen's estimator
_BKV, _SG = registry.variants("BalanceKV"), registry.variants("SubGen/ClusterGen")
PAPERS_MAIN = tuple(_BKV.values()) + (_SG["kcenter"], _SG["subgen"])

CURVE_BUDGETS = (0.1, 0.25, 0.35, 0.5, 0.75)     # 25% and 50%: the practitioner's table reads them
QWEN = "qwen2.5-coder-0.5b"
# every method the main curves draw: the papers' methods and variants, the baselines and the null control, kvpress's
# presses. Left to the claims' own runs: kernel thinning (a slow extra baseline, 4-8 CPU s per compression),
# kvpress's StreamingLLM (the same cache as ours, shown equal on every instance) and RandomPress (uniform without
# weights; the null control covers a random draw)
CURVE_METHODS = tuple(m for m in N.DEFAULT_METHODS if m not in ("kernel_thinning", "kvpress:streaming_llm",
                                                                 "kvpress:random"))
# the needle tasks' and Qwen's perplexity curves: the papers' main variants against the strongest baselines
RULER_METHODS = ("streaming_llm", "uniform", "h2o", "kvpress:snapkv", "kvpress:tova") + PAPERS_MAIN
QUICK_METHODS = ("streaming_llm", "uniform", "h2o", "kvpress:snapkv") + PAPERS_MAIN
SWEEP_METHODS = ("streaming_llm", "h2o", "kvpress:snapkv", _BKV["pseudocode"])
SWEEP_LENGTHS = (1024, 2048, 4096)
SWEEP_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
SWEEP_INSTANCES = 1
RULER = ("niah_single", "niah_multikey", "niah_multivalue", "vt", "cwe")
CURVE_INSTANCES = 20    # instances of a curve cell in the full profile
EXACT_ONLY = 3          # instances of a RULER-style task a model does not solve: exact attention's score is the finding

# (model, task, n, instances, methods): the cells of each profile; methods () = exact attention alone. Measured at
# 2048 tokens (exact attention, question inside): SmolLM2 retrieves niah_single 3/3, niah_multikey 3/3, the
# passkey's digits 3/3, niah_multivalue 0/3, vt 0/3, cwe 0/3; Qwen niah_single 2/2, niah_multikey 2/2, passkey 2/2,
# lines (32) 5/5, niah_multivalue 0/2, vt 0/2, cwe 0/2
# The full profile's e2e share is sized by its trial count: a trial's fixed cost (loading the model, the exact
# prefill capturing the attention inputs, scoring exact attention) dominates it, the methods' compressions and
# scorings being 0.2-3 s each (loaded, SmolLM2 passkey at 2048); Qwen's perplexity curve is left out (its line
# retrieval is the second model's curve) and the exact-only tasks run 3 instances
FULL = (("smollm2", "passkey", 2048, CURVE_INSTANCES, CURVE_METHODS),
        (QWEN, "lines", 2048, CURVE_INSTANCES, CURVE_METHODS),
        ("smollm2", "niah_single", 2048, CURVE_INSTANCES, RULER_METHODS),
        ("smollm2", "ppl", 2048, CURVE_INSTANCES, CURVE_METHODS),
        ) + tuple((m, t, 2048, EXACT_ONLY, ()) for m in ("smollm2", QWEN) for t in RULER
                  if (m, t) != ("smollm2", "niah_single"))
QUICK = (("smollm2", "passkey", 512, 4, QUICK_METHODS),
         (QWEN, "lines", 512, 4, QUICK_METHODS))
LINES = {512: 8, 2048: 32}       # lines of the line-retrieval task (Qwen retrieves 4/4 with 32 at 2048, 0/3 with 128)
CONT = 32                        # held-out tokens scored per perplexity window


def window_of(n: int) -> int:
    """First and last tokens kept exactly (sink = window), both inside the smallest memory (10%): 64 from 1024 tokens
    (every question fits in the last 64), 16 below (quick's 512 tokens: the passkey's question fits, the first part
    of the line question may be compressed)."""
    return 64 if n >= 1024 else 16


def trials(profile: str, claim_tasks: tuple) -> list[dict]:
    """The curve trials of ``profile`` whose task is one of ``claim_tasks`` (each claim runs its own tasks): dicts of
    params with ``curve=True`` (the records of the curves, read by :mod:`kvbounds.e2e.curves`)."""
    cells = {"full": FULL, "quick": QUICK}.get(profile, ())
    out = []
    for model, task, n, count, methods in cells:
        if task not in claim_tasks:
            continue
        for i in range(count):
            out.append(_params(model, task, n, i, methods, CURVE_BUDGETS if methods else ()))
    if profile == "full" and "niah_single" in claim_tasks:
        for n in SWEEP_LENGTHS:
            for depth in SWEEP_DEPTHS:
                for i in range(SWEEP_INSTANCES):
                    out.append(dict(_params("smollm2", "niah_single", n, i, SWEEP_METHODS, (0.25,)), depth=depth))
    return out


def _params(model: str, task: str, n: int, index: int, methods, budgets) -> dict:
    w = window_of(n)
    p = dict(task=task, n=n, index=index, methods=list(methods), budgets=[float(b) for b in budgets], sink=w,
             window=w, model=model, device="cpu", curve=True)
    if task == "ppl":
        p["cont"] = CONT
    else:
        p.update(setting="inside", block_size=128)
    if task == "lines":
        p["n_lines"] = LINES.get(n, 32)
    return p


def claim_records(records) -> list:
    """The records a claim's verdict and the leaderboard read: the claim's own trials (quick: its fixed budget) when
    it has any, else the curves' (full: the curves are the claim's trials); never the depth sweep's."""
    own = [r for r in records if not (getattr(r, "params", None) or {}).get("curve")]
    if own:
        return own
    return [r for r in records if (getattr(r, "params", None) or {}).get("depth") is None]
