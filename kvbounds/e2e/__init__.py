"""End to end: every compressor inside a real model through Hugging Face transformers, beside NVIDIA kvpress's presses,
on perplexity, passkey retrieval and line retrieval at equal memory (the harness, its tasks, the weighted attention
and cache, the leaderboard's rows).

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.verdict, kvbounds.methods, kvbounds.core, kvbounds.claims, kvbounds.traces, kvbounds.algorithms; the layers
are a contract (tests/package/test_structure.py).
"""
# The room's modules load on first use of a name (PEP 562): the weighted cache needs torch and transformers (the hf
# extra), and the command line reads the method names without loading the compressors.
from kvbounds import _lazy_face
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # what static tools (mypy, jedi) read
    from ._attention import register, require_weighted_attention, use_weighted_attention
    from ._comparisons import call
    from ._checks import SETTING_WORDS, add_curves, claim_trials, profile_grid, reproduction_verdict
    from ._falsifiers import window_effects, window_rows
    from ._h2o import h2o_prefill
    from ._kvpress_answers import check_pipeline_call, pipeline, pipeline_class, weighted_answers
    from ._layer_stacks import (balancekv_layers, fitted_layers_as_heads, layers_as_heads, middle_traversal_layers,
                                prefix_traversal_layers, released_layers)
    from ._leaderboard import first_retrieval, leaderboard_rows, row, t_interval, tied, timing_rows
    from ._method_names import CONTROLS, DEFAULT_METHODS, KVPRESS, OURS
    from ._methods import budget_problem, compress_kvpress_prefill, compress_layer, compress_ours
    from ._model import LoadedModel, load_model, model_context
    from ._trial import hf_missing, run_cell_trial, trial_model
    from ._weighted_cache import ModelNotWeighted, WeightedCache, WeightedLayer, visible_tokens
    from ._verdict_text import MISS_PHRASE

_NAMES = {
    'register': '._attention',
    'require_weighted_attention': '._attention',
    'use_weighted_attention': '._attention',
    'call': '._comparisons',
    'SETTING_WORDS': '._checks',
    'add_curves': '._checks',
    'claim_trials': '._checks',
    'profile_grid': '._checks',
    'reproduction_verdict': '._checks',
    'window_effects': '._falsifiers',
    'window_rows': '._falsifiers',
    'check_pipeline_call': '._kvpress_answers',
    'pipeline': '._kvpress_answers',
    'pipeline_class': '._kvpress_answers',
    'weighted_answers': '._kvpress_answers',
    'h2o_prefill': '._h2o',
    'balancekv_layers': '._layer_stacks',
    'fitted_layers_as_heads': '._layer_stacks',
    'layers_as_heads': '._layer_stacks',
    'middle_traversal_layers': '._layer_stacks',
    'prefix_traversal_layers': '._layer_stacks',
    'released_layers': '._layer_stacks',
    'first_retrieval': '._leaderboard',
    'leaderboard_rows': '._leaderboard',
    'row': '._leaderboard',
    't_interval': '._leaderboard',
    'tied': '._leaderboard',
    'timing_rows': '._leaderboard',
    'MISS_PHRASE': '._verdict_text',
    'CONTROLS': '._method_names',
    'DEFAULT_METHODS': '._method_names',
    'KVPRESS': '._method_names',
    'OURS': '._method_names',
    'budget_problem': '._methods',
    'compress_kvpress_prefill': '._methods',
    'compress_layer': '._methods',
    'compress_ours': '._methods',
    'LoadedModel': '._model',
    'load_model': '._model',
    'model_context': '._model',
    'hf_missing': '._trial',
    'run_cell_trial': '._trial',
    'trial_model': '._trial',
    'ModelNotWeighted': '._weighted_cache',
    'WeightedCache': '._weighted_cache',
    'WeightedLayer': '._weighted_cache',
    'visible_tokens': '._weighted_cache',
}

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _lazy_face(__name__, _NAMES)
