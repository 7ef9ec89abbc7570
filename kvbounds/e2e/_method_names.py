"""The end-to-end harness's method lists, derived from the method registry (:mod:`kvbounds.methods`, which imports
nothing heavy: the CLI builds its parser from these names without loading the compressors)."""
from kvbounds import methods as _registry

# run by kvbounds' own code (kernel_thinning: a baseline through goodpoints, the optional extra kvbounds[kt]; without
# it its rows are skipped with the install command)
OURS = tuple(m.name for m in _registry.methods(source="kvbounds") if m.role not in ("control", "ablation"))
# kvpress's presses by short name -> kvpress's class
PRESSES = {m.name.split(":", 1)[1]: m.press for m in _registry.methods(source="kvpress")}
KVPRESS = _registry.names(source="kvpress")
# the end-to-end checks' null control: uniform sampling again, from its own random stream (the harness seeds each
# method separately), so "better than uniform" must not be found for it
CONTROLS = _registry.names(role="control")
DEFAULT_METHODS = OURS + CONTROLS + KVPRESS
# methods that read the prefill's captured attention inputs (queries), not only K and V
NEEDS_INPUTS = _registry.names(needs_queries=True)
# methods that read the attention each key received from the prompt's queries, collected during the prefill
# (harness.prefill(received=True); without it they recompute it from the captured inputs)
NEEDS_SCORES = _registry.names(needs_scores=True)
# methods whose cache depends on a random draw: the checks redraw them (robustness to the method's randomness)
RANDOMIZED = _registry.names(randomized=True)
