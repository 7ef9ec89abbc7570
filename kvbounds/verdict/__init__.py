"""Verdicts: what a claim's verdict is made of (its dimensions and their values), the rules that decide each dimension
from the records, the statistics they share, and the one rule for "better" (:func:`paired_calls`, its words
:func:`call_words`) that every comparison of the package calls.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.methods, kvbounds.core, kvbounds.claims; the layers are a contract (tests/package/test_structure.py).
"""
from ._calls import (ALPHA, CALLS, DOING_NOTHING, LABELS, METRICS, PRACTICAL_RATIO, TIE_PRECISION, Call, Comparison,
                     control_order, detectable, effects, hodges_lehmann, label, metric_words, paired_calls, per_unit,
                     rule_for, signed_rank, smallest_p)
from ._call_words import (SHORT_METRIC, call_words, fmt, head_words, headline_calls, holm_family_words, metric_prefix,
                          numbers, summary_words, versus_doing_nothing)
from ._fields import (Constant, Erratum, FigureSpec, Finding, POWER_VALUES, PROOF_VALUES, RATE_VALUES,
                      REPRODUCTION_VALUES, RateInfo, Reproduction, STATEMENT_VALUES, Vacuity, Verdict)
from ._power import Control, controls_from_records, controls_rejected, decide_power
from ._rate import (FIT_FROM, UnitFit, decide_onset_rate, flat_from, rate_words, unit_fit, units_needed,
                    window_fits)
from ._reproduction import combine_reproductions, reproduction_status, statement_from_reproduction
from ._rules import (FAILS, GROWTH_TOL, HOLDS, HOLDS_FITTED, INCONCLUSIVE, MIN_INSTANCES, MIN_REDRAWS, NOT_REFUTED,
                     NOT_RUN, NO_CHECK, VACUOUS, counterexample, decide, decide_rate,
                     erratum_from_finding, finalize, fitted_constant, mark, spread_words, standard_verdict)
from ._statistics import canonical_order, growth, holm_adjust, loglog_slope
from ._vacuity import decide_vacuity, not_every_norm

__all__ = ["ALPHA", "CALLS", "DOING_NOTHING", "LABELS", "METRICS", "PRACTICAL_RATIO", "TIE_PRECISION", "Call",
           "Comparison", "control_order", "detectable", "effects", "hodges_lehmann", "label", "metric_words",
           "paired_calls", "per_unit", "rule_for", "signed_rank", "smallest_p", "SHORT_METRIC", "call_words", "fmt",
           "head_words", "headline_calls", "holm_family_words", "metric_prefix", "numbers", "summary_words",
           "versus_doing_nothing", "Constant", "Erratum", "FigureSpec", "Finding", "POWER_VALUES", "PROOF_VALUES",
           "RATE_VALUES", "REPRODUCTION_VALUES", "RateInfo", "Reproduction", "STATEMENT_VALUES", "Vacuity", "Verdict",
           "Control", "controls_from_records", "controls_rejected", "decide_power", "FIT_FROM", "UnitFit",
           "decide_onset_rate", "flat_from", "rate_words", "unit_fit", "units_needed", "window_fits", "combine_reproductions",
           "reproduction_status", "statement_from_reproduction", "FAILS", "GROWTH_TOL", "HOLDS", "HOLDS_FITTED",
           "INCONCLUSIVE", "MIN_INSTANCES", "MIN_REDRAWS", "NOT_REFUTED", "NOT_RUN", "NO_CHECK", "VACUOUS",
           "counterexample", "decide", "decide_rate", "erratum_from_finding", "finalize", "fitted_constant", "mark",
           "spread_words", "standard_verdict", "canonical_order", "growth", "holm_adjust", "loglog_slope",
           "decide_vacuity", "not_every_norm"]
