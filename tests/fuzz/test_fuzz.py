"""Fuzz suite of issues 11 and 24: every public entry point of kvbounds (kvbounds.algorithms, kvbounds.gpu, the
e2e layer's array functions, traces.synthetic), under the input classes of tests/fuzz/fuzz_harness.py, classified call
by call. 0 defects allowed: no silent NaN/Inf, no answer
that disagrees with its float64 / mpmath reference, no exception other than InputError (or the documented
WalkFailed / DegenerateEstimate), no call past the time limit.

The default run makes DEFAULT_EXAMPLES calls per entry (~2,300 in all); ``-m fuzz`` (``make test-all``)
makes FUZZ_EXAMPLES per entry (>= 10^4 in all). With ``KVBOUNDS_FUZZ_TABLE=DIR`` each entry writes its tally
(calls per outcome) to DIR/<entry>.json; ``python tests/fuzz/fuzz_table.py DIR`` prints the table per entry point.
An entry of a module being rewritten elsewhere may set ``Entry.owner``: it is then xfail (non-strict) in the long
run and skipped in the default slice (none is set: every entry must be clean)."""
from __future__ import annotations

import json
import os
import re
import warnings

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import importlib
from pathlib import Path

from fuzz_harness import (ARRAY_CORRUPTIONS, DATA_CLASSES, DEFECTS, PARAM_VALUES, Case, Entry, build, classify)

DEFAULT_EXAMPLES = 25      # ~3,000 calls over ~130 entries: the default suite's fast slice (issue 24: seconds)
FUZZ_EXAMPLES = 300
# every tests/fuzz_entries*.py (fuzz_entries, _surface, _checks, ...): a new file of entries is fuzzed, and its
# NOT_ENTRY_POINTS count for the enumeration test below, without editing this test
ENTRY_FILES = sorted(Path(__file__).parent.glob("fuzz_entries*.py"))
ENTRIES = [e for f in ENTRY_FILES for e in importlib.import_module(f.stem).ENTRIES]


@st.composite
def cases(draw, entry: Entry) -> Case:
    arrays = list(entry.arrays(__import__("numpy").random.default_rng(0), "normal"))
    modes = ["valid", "valid"] + (["array", "array"] if arrays else []) + (["param"] if entry.params else [])
    mode = draw(st.sampled_from(modes))
    data = draw(st.sampled_from(DATA_CLASSES))
    target = corruption = None
    if mode == "array":
        target, corruption = draw(st.sampled_from(arrays)), draw(st.sampled_from(ARRAY_CORRUPTIONS))
    elif mode == "param":
        target, corruption = draw(st.sampled_from(sorted(entry.params))), draw(st.sampled_from(PARAM_VALUES))
    return Case(data, mode, target, corruption, draw(st.integers(0, 2**31 - 1)))


def _write_tally(entry: Entry, examples: int, calls: list) -> None:
    where = os.environ.get("KVBOUNDS_FUZZ_TABLE")
    if not where:
        return
    os.makedirs(where, exist_ok=True)
    tally = {k: calls.count(k) for k in ("ok", "clear", "harness") + DEFECTS}
    name = re.sub(r"[^A-Za-z0-9_.+\[\]-]", "_", entry.name)[:120]
    with open(os.path.join(where, f"{name}.{examples}.json"), "w") as f:
        json.dump(dict(entry=entry.name, examples=examples, calls=len(calls), owner=entry.owner, **tally), f)


def _fuzz(entry: Entry, examples: int) -> None:
    defects: list[str] = []
    calls = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases(entry))
    def run(case: Case) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            outcome, detail = classify(entry, build(entry, case))
        calls.append(outcome)
        if outcome in DEFECTS + ("harness",):
            defects.append(f"{outcome}: {entry.name}({case.describe()}): {detail[:300]}")

    run()
    _write_tally(entry, examples, calls)
    assert len(calls) >= examples // 2, f"only {len(calls)} calls made"
    assert not defects, f"{len(defects)} defect(s) in {len(calls)} calls:\n" + "\n".join(defects[:10])


def _params(entries, long: bool):
    """Entries of another engineer's module: xfail in the long run (their tally goes to the table), left out of the
    default slice (it stays fast); remove ``owner`` once that module follows docs/INPUTS.md."""
    mark = lambda e: pytest.mark.xfail(reason=f"owned by the {e.owner}", strict=False) if long else \
        pytest.mark.skip(reason=f"owned by the {e.owner}: fuzzed by the long run (-m fuzz)")
    return [pytest.param(e, id=e.name, marks=[mark(e)] if e.owner else []) for e in entries]


@pytest.mark.parametrize("entry", _params(ENTRIES, long=False))
def test_fuzz_entry(entry: Entry) -> None:
    _fuzz(entry, DEFAULT_EXAMPLES)


@pytest.mark.fuzz
@pytest.mark.parametrize("entry", _params(ENTRIES, long=True))
def test_fuzz_entry_long(entry: Entry) -> None:
    _fuzz(entry, FUZZ_EXAMPLES)


# Public callables that are not fuzz entries, each with its reason (a name, or module.name for that module's only).
# Everything else that a module of PACKAGES exports (its __all__, else every public function and class it defines)
# must be called by an entry.
NOT_ENTRY_POINTS = {
    # the scale sweep's lockstep MergeAndReduce (its walk step and its driver): MR.error's scale sweep calls them on its
    # own drawn stream; tests/algorithms/test_merge_reduce_lockstep.py checks them against MergeAndReduce step for step
    "masked_walk", "merge_and_reduce_lockstep",
    # the rendered block's run line (reached through the README block's rendering)
    "run_line",
    # data holders and exceptions
    "InputError", "WalkFailed", "DegenerateEstimate", "WalkResult", "KCenterResult", "SoftmaxBalanceResult",
    "SubGenState", "Chunk", "OpCounter", "PublicCoins", "IndexInstance", "SlotBatch", "GroupAttention", "Trace",
    "BackendUnavailable", "LoadedModel", "Prefill", "Task", "KernelGram",
    # reached through make_selector / make_compressor / attend (their entries above)
    "TokenSelector", "StreamingLLM", "H2O", "Uniform", "KCenter", "UniformSampling", "StreamingBalanceKV",
    "BlockwiseBalanceKV", "SubGenSketch", "Clairvoyant", "subgen_class", "aggregate", "draft_gamma",
    # SubGen's estimator half (lines 29-31), a base class of SubGen (whose entries reach it)
    "QueryStreamAttn",
    # the draft's pseudocode transcribed literally: its NaN on masked chunks is the documented finding
    "blockwise_softmax_literal",
    # the logit helper behind every softmax: its callers validate its inputs (covered through softmax_weights)
    "shifted_logits",
    # INDEX-game decoding on instances built by the entries above (tests/algorithms/test_index_reduction.py)
    "build_instance", "bob_value", "bob_decode", "lemma_sum", "collisions", "read_values", "decode_group",
    "eq2_error",
    # the step-by-step reference of panel_walk (the reference of the panel_walk / walk_signs entries)
    "panel_walk_stepwise",
    # the argument checks of panel_walk / walk_signs (run by their entries)
    "check_walk_inputs",
    # a diagnostic recomputed from a level's own walk inside blockwise_balance_select (diagnostics=[...])
    "walk_diagnostic",
    # a hook returning compress_cache_released (its entry above) or None
    "released_balancekv",
    # gpu: a context manager limiting BLAS threads (no data; tests/algorithms/test_backend.py), a profiler-based
    # benchmark
    # counter on fixed internal inputs (seconds per call; tests/gpu/test_batched_walk.py), the Triton kernel launcher
    # behind walk_signs(method="triton") (needs CUDA; reached after walk_signs's checks)
    "single_blas_thread", "ops_per_step", "triton_panel_steps",
    # e2e: functions of a loaded model and its prefill (seconds per call; tests/e2e/test_e2e.py, test_e2e_device.py)
    "smollm2_state_dict", "load_smollm2", "load_model", "agreement", "prefill", "score_tail", "run_cell",
    "ppl_task", "passkey_task", "lines_task", "make_task", "run_cell_trial", "compress_kvpress", "compress_all",
    "make_press", "lowrank_perplexity", "window_rows", "slice_prefill", "score_tails", "batch_layers",
    # e2e: a function of per-window floats (no model; tests/proofs_checks/test_sub_lowrank_e2e.py)
    "window_effects",
    # e2e: compress_all's stacked host path on a prefill (tests/e2e/test_e2e_layers.py: equal to layer by layer)
    "compress_stacked",
    # e2e: functions of Record lists and claim tables (no arrays, or dicts of floats the one rule checks; tests/e2e/test_e2e_controls.py, test_e2e.py)
    "hf_missing", "claim_trials", "profile_grid", "units", "paired_compare", "unit_comparison", "controls", "setup_line",
    "skipped_notes", "compare", "reproduction_verdict", "leaderboard_rows", "timing_rows",
    # e2e: the transformers registration hook (no arguments) and the `kvbounds e2e` CLI (tests/e2e/test_e2e.py)
    "register", "add_parser", "run",
    # e2e: a probe without arguments that imports kvpress (seconds on a first call; tests/e2e/test_e2e.py)
    "kvpress_available",
    # algorithms: a probe without arguments (is goodpoints importable; tests/algorithms/test_kernel_thinning.py)
    "goodpoints_missing",
    # e2e: functions of a loaded model (tests/e2e/test_weighted_cache.py, test_press.py, test_e2e.py) and the
    # exception a model on the wrong attention raises
    "use_weighted_attention", "require_weighted_attention", "accumulated_attention", "h2o_compress",
    "ModelNotWeighted",
    # e2e: H2O's scores from a prefill's rotated torch queries/keys (refuses other input by name) and the prefill
    # observer's context manager (tests/e2e/test_e2e_h2o_scores.py)
    "received_attention", "observe_prefill",
    # e2e: the floats of a SubGen round, for arrays the compressor has already checked
    # (tests/e2e/test_e2e_subgen_rounds.py)
    "subgen_held_floats",
    # e2e: functions of Record lists, claim tables and parsed CLI arguments (no arrays; tests/test_e2e*.py)
    "reference_effects", "problems", "print_board", "effects", "paired", "cell", "duplicates", "detectable",
    "family", "budget_label", "first_retrieval", "task_label", "row", "t_interval", "tied", "check_rows",
    # the method registry's contract functions (kvbounds.methods), reached through compress_ours / compress_all (their
    # entries), which check K, V, floats, sink, window, block_size and rng first; the argument checks they run; the
    # stacked and prefill forms of compress_all (tests/e2e/test_e2e_layers.py, test_e2e.py: equal to layer by layer)
    "streaming_llm", "uniform", "kcenter", "kcenter_sized", "balancekv", "balancekv_released", "subgen", "subspace",
    "kernel_thinning", "h2o", "fit_to_floats", "check_sizes", "check_layer_kv", "h2o_prefill",
    "compress_kvpress_prefill", "balancekv_layers", "released_layers", "middle_traversal_layers",
    "prefix_traversal_layers", "traversal_layers", "layers_as_heads", "fitted_layers_as_heads",
    # helpers shared between the modules of one algorithm (formerly private names imported across modules), each
    # reached through the public entries that call them, after their checks: argument checks, the walk's inner steps
    # and scratch buffers, the compressors' pieces, host copies of small arrays
    "DeviceStream", "ScratchPool", "argsort_head", "bincount", "check_block", "check_cache", "check_exponent_rounding",
    "check_fields", "check_kv", "check_levels", "check_row_scale", "check_traversal", "cluster_counts", "exact_part",
    "exp_inplace", "gather_dev", "gram_panel", "gram_walk_unchecked", "host_empty", "host_floats", "host_view",
    "l2_draws", "l2_sample", "mul_pow2", "native", "not_weighted_message", "on_backend_of", "on_host", "panel_scales",
    "panel_walk_unchecked", "pow2_exponent", "setting_params", "split_budget", "take_rows", "unique_counts",
    "walk_choose", "walk_finish", "walk_finish_np", "weight_floats", "with_exact_ends",
    # the array layer's constructor of InputError (a message in, an exception out)
    "input_error",
    # the INDEX reduction's parameter checks and closed forms, shared with kvbounds.theory.lower_bound
    # (tests/theory/test_lower_bound_theory.py, test_index_reduction.py)
    "check_dimension", "check_radius", "check_length", "exponent", "bob_threshold", "log2_binomial",
    # controls: the power rule's result (data holders, made by power_vs_controls: its entry)
    "PowerCell", "TrivialPower",
    # checks' helpers that run a real model: a window of a real trace (loads the model's cached layer: seconds; its
    # argument checks in tests/battery/test_controls.py), the decode observer and the generation it measures (a loaded
    # model and a press; tests/proofs_checks/test_decode_checks.py and the smoke run of BKV.decode / SG.decode)
    "real_stream", "DecodeObserver", "run_generation", "run_forced",
    # the distinct texts a real family reads and a generation's prompt text (the corpus and a model's tokenizer:
    # seconds; tests/test_corpus.py), and the power trials' stream (a data holder, made by stream: its entries)
    "real_texts", "prompt_unit", "PowerStream",
    # the decode checks' model and prompt (a loaded model; used by benchmarks/walk_cause.py and the streaming bench)
    "decode_model", "tiny_model", "prompt_tokens",
    # the one rule's data holders (made by paired_calls: its entry)
    "Call", "Comparison",
    # e2e: the verdicts' words from Record lists (evidence against, per-variant calls, the budgets each method ran)
    # and from method names (the registry's words; an unknown name stays as it is; tests/e2e/test_e2e_rule.py)
    "budgets_line", "retrieval_counts", "evidence_against", "calls_text", "short_name", "variant_label",
    # e2e: a variant's calls as its verdict stores them (compare()'s output; tests/test_calls_agree.py and
    # tests/test_e2e_rule.py)
    "cell_calls",
    # e2e: a model's context length read from its configuration files, and the CLI's removal of repeated
    # --methods / --budgets (parsed arguments, no arrays; tests/e2e/test_e2e_cli.py)
    "model_context", "dedupe",
    # e2e: the curves from Record lists and the curve grid's parameters (no arrays; tests/test_e2e_curves.py), a
    # model's record label from its --model name, and the RULER-style tasks of a loaded model's tokenizer
    # (tests/test_e2e_curves.py, the curve trials)
    "add_curves", "window_of", "claim_records", "panel_key", "points", "exact_scores", "decisions", "decision_words",
    "model_label", "niah_task", "vt_task", "cwe_task", "make",
    # e2e (issue 46, merged after the gate counted calls): named by their module (the names are common words); the
    # paired call of the curves and the curves' scores, metric names and timing from Record lists, which the word
    # count took for covered. No fuzz entry yet: call() checks none of its arguments (a NaN unit, margin, tests,
    # alpha) -- a follow-up for the curves' owner
    "kvbounds.e2e._comparisons.call", "kvbounds.e2e.curves.score", "kvbounds.e2e.curves.metric",
    "kvbounds.e2e.curves.timing",
    # the curves' calls over the one rule (issue 45's merge): comparison() pairs a panel's Record lists and calls()
    # hands the pairs to kvbounds.verdict.paired_calls, whose arguments are checked at its face and fuzzed there
    # (tests/fuzz/fuzz_entries_battery.py); no entry of their own yet -- the same follow-up as call()
    "kvbounds.e2e._comparisons.comparison", "kvbounds.e2e._comparisons.calls",
    # the RULER tasks' filler words (no arguments; read from the default text once) and the press classes' builder
    # (run at import over the registry's entries, no arrays: the classes it builds are the presses' entries)
    "kvbounds.e2e.ruler.vocabulary", "kvbounds.presses._kvpress.press_class",
} | {name for f in ENTRY_FILES for name in getattr(importlib.import_module(f.stem), "NOT_ENTRY_POINTS", ())}
# Packages and modules whose public callables must be fuzz entries (a module is enumerated alone, a package with its
# subpackages): add a name here, and its entries in a tests/fuzz_entries*.py file, to cover a new surface.
PACKAGES = ("kvbounds.algorithms", "kvbounds.gpu", "kvbounds.e2e", "kvbounds.presses._kvpress",
            "kvbounds.battery._power_rule", "kvbounds.battery._controls", "kvbounds.battery._ablations",
            "kvbounds.verdict._calls", "kvbounds.verdict._call_words", "kvbounds.streams._power",
            "kvbounds.proofs_checks.decode_stream",
            "kvbounds.proofs_checks.decode_verdict", "kvbounds.presses._streaming", "kvbounds.testing",
            "kvbounds.streams._families", "kvbounds.evaluation._stream_press", "kvbounds.evaluation._evaluate",
            "kvbounds.evaluation._spec", "kvbounds.evaluation._streams", "kvbounds.evaluation._decode",
            "kvbounds.evaluation._e2e", "kvbounds.evaluation._card", "kvbounds.cli._evaluate",
            "kvbounds.report._report", "kvbounds.report._chips", "kvbounds.report._figures",
            "kvbounds.report._glance", "kvbounds.report._html", "kvbounds.report._leaderboard",
            "kvbounds.report.markdown", "kvbounds.report._meta", "kvbounds.report._power", "kvbounds.report._summary",
            "kvbounds.report._words", "kvbounds.report._paper_answers", "kvbounds.report._practitioner",
            "kvbounds.report.summary_read", "kvbounds.report._glossary", "kvbounds.report._rows", "kvbounds.core._output_files",
            "kvbounds.core._records")


def public_callables() -> dict[str, list[str]]:
    """module -> public callables, for every module of PACKAGES that exists (subpackages included, so a new module
    is enumerated without editing this test): the module's __all__, else the functions and classes it defines."""
    import importlib
    import inspect
    import pkgutil
    out: dict[str, list[str]] = {}
    for pkg_name in PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except ImportError:
            continue
        mods = [pkg_name] + [m.name for m in pkgutil.walk_packages(getattr(pkg, "__path__", []), pkg_name + ".")]
        for mod_name in mods:
            if mod_name.endswith(".validation"):          # the checks themselves
                continue
            m = importlib.import_module(mod_name)
            if hasattr(m, "__all__"):
                # a face's re-export is counted where it is defined, when that module is enumerated too
                names = [n for n in m.__all__ if callable(getattr(m, n, None))
                         and not (getattr(getattr(m, n), "__module__", mod_name) != mod_name
                                  and getattr(getattr(m, n), "__module__", "") in mods)]
            else:
                names = [n for n, o in vars(m).items() if not n.startswith("_") and callable(o)
                         and getattr(o, "__module__", None) == m.__name__ and (inspect.isfunction(o) or inspect.isclass(o))]
            out[mod_name] = names
    return out


def codes_of(obj) -> set:
    """The code objects that run when ``obj`` is called: a function's own (decorators unwrapped); a class's methods,
    properties and generated ``__init__`` (a dataclass's), each defined in the class itself."""
    import inspect
    if inspect.isclass(obj):
        fns = [f for v in vars(obj).values()
               for f in (v, getattr(v, "__func__", None), getattr(v, "fget", None), getattr(v, "fset", None))]
    else:
        fns = [obj]
    out = set()
    for f in fns:
        if callable(f):
            code = getattr(inspect.unwrap(f), "__code__", None)
            if code is not None:
                out.add(code)
    return out


def _caches(public=()) -> list:
    """The memoised functions whose caches would hide a call from the recording: the entry files' own (a base
    summary, a base page: computed once per process, by whichever test came first) and the public callables'."""
    mods = [importlib.import_module(f.stem) for f in ENTRY_FILES]
    return [o for m in mods for o in vars(m).values() if hasattr(o, "cache_clear")] + \
        [o for o in public if hasattr(o, "cache_clear")]


def called_by_entries(entries, public=()) -> set:
    """The code objects every entry's call runs, at any depth, on its first valid case (recorded by cProfile, around
    the call only: an entry's reference computation does not count), with the entry files' caches and those of the
    ``public`` callables cleared first, so that what is recorded does not depend on which tests ran before (within
    the recording, what one entry computes and another reuses was called by the first: the union is the same)."""
    import cProfile
    from fuzz_harness import time_limit
    called: set = set()
    for f in _caches(public):
        f.cache_clear()
    for e in entries:
        kw = build(e, Case("normal", "valid", None, None, 0))
        prof = cProfile.Profile()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with time_limit(60.0):
                    prof.enable()
                    try:
                        e.call(**kw)
                    finally:
                        prof.disable()
            except Exception:  # noqa: BLE001 - what it raised is the fuzz tests' business; what it called counts
                pass
        called |= {s.code for s in prof.getstats() if not isinstance(s.code, str)}
    return called


def test_every_public_entry_point_is_fuzzed() -> None:
    """A public callable of PACKAGES (kvbounds.algorithms, kvbounds.gpu, kvbounds.e2e, the presses, kvbounds.battery,
    the checks' shared helpers, the report layer, the output files and the record store) must be called by a fuzz
    entry (fuzz_entries*.py) on its valid case, or listed, with its reason, in NOT_ENTRY_POINTS (a file's own
    NOT_ENTRY_POINTS counts). Calls are recorded (cProfile: the code objects run), not words: a callable named in an
    entry's name or text but never reached does not count (issue 43)."""
    import sys
    if sys.getprofile() is not None:
        pytest.skip("another profiler is active (coverage?): the calls cannot be recorded")
    mods = public_callables()
    assert {"kvbounds.algorithms.token_selection", "kvbounds.gpu.batched_walk", "kvbounds.e2e._methods",
            "kvbounds.battery._power_rule", "kvbounds.proofs_checks.decode_verdict",
            "kvbounds.core._output_files", "kvbounds.core._records"} <= set(mods)
    wanted = {(mod, name): getattr(importlib.import_module(mod), name) for mod, names in mods.items()
              for name in names if name not in NOT_ENTRY_POINTS and f"{mod}.{name}" not in NOT_ENTRY_POINTS}
    called = called_by_entries(ENTRIES, public=wanted.values())
    missing = [f"{mod}.{name}" for (mod, name), obj in wanted.items() if not codes_of(obj) & called]
    assert not missing, f"public callables no fuzz entry calls (list them with a reason in NOT_ENTRY_POINTS): " \
                        f"{missing}"


def test_the_gate_counts_calls_not_words() -> None:
    """An entry that names a callable (in its name, or anywhere in its file) but never calls it covers nothing; one
    that calls it covers it, at any depth; a class is covered by any of its own methods running."""
    from kvbounds.report import _words as rw
    from kvbounds.core import Record
    liar = Entry("check_text+write_report", lambda r, c: {}, {}, lambda: "check_text")
    honest = Entry("x", lambda r, c: {}, {}, lambda: [rw.verdict_in_words] and rw.check_text("holds"))
    builds = Entry("y", lambda r, c: {}, {}, lambda: Record("X.y", {}, 0, "numpy", 1.0, 2.0, True).ratio)
    assert not codes_of(rw.check_text) & called_by_entries([liar])
    assert codes_of(rw.check_text) & called_by_entries([honest])
    assert not codes_of(rw.verdict_in_words) & called_by_entries([honest])
    assert codes_of(Record) & called_by_entries([builds])


def test_the_time_limit_is_the_calls_cpu_time_with_a_wall_clock_backstop() -> None:
    """A slow call on a loaded machine was classified a hang (5 s of wall clock; the long fuzz's generate[streaming,
    subgen] at load 9: 2 CPU s, 5 s wall): the limit is the main thread's CPU time now, and a call blocked without
    computing is still caught by the wall clock."""
    import time
    from fuzz_harness import Hang, time_limit
    with time_limit(0.2, wall=5.0):
        time.sleep(0.4)                             # waiting costs no CPU: no hang
    def spin():
        while True:
            pass
    for block, wall in ((lambda: time.sleep(3.0), 0.5), (spin, 30.0)):
        t0 = time.monotonic()
        with pytest.raises(Hang):
            with time_limit(0.2, wall=wall):
                block()
        assert time.monotonic() - t0 < 20


def test_query_discrepancy_refuses_leading_shapes_that_do_not_broadcast() -> None:
    """Found by the long fuzz: signs whose leading shape does not broadcast with K's and V's were a numpy ValueError
    from the product; now an InputError naming the shapes."""
    import numpy as np
    from kvbounds.algorithms.query_discrepancy import query_discrepancy
    from kvbounds.algorithms.validation import InputError
    rng = np.random.default_rng(0)
    K, V, Q = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 1)), rng.standard_normal((2, 2, 4))
    with pytest.raises(InputError, match="must broadcast"):
        query_discrepancy(np.ones((0, 3)), K, V, Q)
    assert set(query_discrepancy(np.ones((2, 3)), K, V, Q)) == {"query_num", "query_den"}


def test_released_walk_kernel_overflow_is_an_input_error() -> None:
    """Found by the fuzz entries: keys of norm 1e3 overflow the released kernel exp(<k~_i, k~_j>/sqrt d); the
    walk's sums became inf - inf = NaN and every sign silently -1. Now an InputError naming the overflow."""
    import numpy as np

    from kvbounds.algorithms.balance_kv_released import released_select
    from kvbounds.algorithms.validation import InputError
    rng = np.random.default_rng(0)
    K, V = rng.standard_normal((8, 3)) * 1e3, rng.standard_normal((8, 2))
    with pytest.raises(InputError, match="overflows"):
        released_select(K, V, levels=1, block_size=4, rng=rng)
