"""Verdicts: what a claim's verdict is made of (its dimensions and their values), the rules that decide each dimension
from the records, and the statistics they share.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.methods, kvbounds.core, kvbounds.claims; the layers are a contract (tests/package/test_structure.py).
"""
from ._fields import (Constant, Erratum, FigureSpec, Finding, POWER_VALUES, PROOF_VALUES, RATE_VALUES,
                      REPRODUCTION_VALUES, RateInfo, Reproduction, STATEMENT_VALUES, Vacuity, Verdict)
from ._power import Control, controls_from_records, controls_rejected, decide_power
from ._reproduction import combine_reproductions, reproduction_status, statement_from_reproduction
from ._rules import (FAILS, GROWTH_TOL, HOLDS, HOLDS_FITTED, INCONCLUSIVE, MIN_INSTANCES, MIN_REDRAWS, NOT_REFUTED,
                     NOT_RUN, NO_CHECK, VACUOUS, counterexample, decide, decide_rate, decide_regime_rate,
                     erratum_from_finding, finalize, fitted_constant, mark, spread_words, standard_verdict)
from ._statistics import canonical_order, growth, holm_adjust, loglog_slope, significant_cells
from ._vacuity import decide_vacuity, not_every_norm

__all__ = ["Constant", "Erratum", "FigureSpec", "Finding", "POWER_VALUES", "PROOF_VALUES", "RATE_VALUES",
           "REPRODUCTION_VALUES", "RateInfo", "Reproduction", "STATEMENT_VALUES", "Vacuity", "Verdict", "Control",
           "controls_from_records", "controls_rejected", "decide_power", "combine_reproductions", "reproduction_status",
           "statement_from_reproduction", "FAILS", "GROWTH_TOL", "HOLDS", "HOLDS_FITTED", "INCONCLUSIVE",
           "MIN_INSTANCES", "MIN_REDRAWS", "NOT_REFUTED", "NOT_RUN", "NO_CHECK", "VACUOUS", "counterexample", "decide",
           "decide_rate", "decide_regime_rate", "erratum_from_finding", "finalize", "fitted_constant", "mark",
           "spread_words", "standard_verdict", "canonical_order", "growth", "holm_adjust", "loglog_slope",
           "significant_cells", "decide_vacuity", "not_every_norm"]
