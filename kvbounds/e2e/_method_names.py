"""The end-to-end harness's method lists, derived from the method registry (:mod:`kvbounds.methods`) when first read
(PEP 562): the registry's methods name functions of this room (their stacked and prefill forms), so a module that
loading them imports must not read the registry while it is imported."""
from functools import cache

from kvbounds import methods as _registry

__all__ = ["OURS", "PRESSES", "KVPRESS", "CONTROLS", "DEFAULT_METHODS", "NEEDS_INPUTS", "NEEDS_SCORES", "RANDOMIZED"]


@cache
def _lists() -> dict:
    # run by kvbounds' own code (kernel_thinning: a baseline through goodpoints, the optional extra kvbounds[kt];
    # without it its rows are skipped with the install command)
    ours = tuple(m.name for m in _registry.methods(source="kvbounds") if m.role not in ("control", "ablation"))
    # the end-to-end checks' null control: uniform sampling again, from its own random stream (the harness seeds
    # each method separately), so "better than uniform" must not be found for it
    controls = tuple(m.name for m in _registry.methods(role="control") if m.source != "external")
    kvpress = _registry.names(source="kvpress")
    return dict(
        OURS=ours,
        # kvpress's presses by short name -> kvpress's class
        PRESSES={m.name.split(":", 1)[1]: m.press for m in _registry.methods(source="kvpress")},
        KVPRESS=kvpress,
        CONTROLS=controls,
        # what the end-to-end checks run by default: the package's own and kvpress's (a third party's method,
        # source "external", runs when named: kvbounds e2e --methods NAME)
        DEFAULT_METHODS=ours + controls + kvpress,
        # methods that read the prefill's captured attention inputs (queries), not only K and V
        NEEDS_INPUTS=_registry.names(needs_queries=True),
        # methods that read the attention each key received from the prompt's queries, collected during the prefill
        # (harness.prefill(received=True); without it they recompute it from the captured inputs)
        NEEDS_SCORES=_registry.names(needs_scores=True),
        # methods whose cache depends on a random draw: the checks redraw them (robustness to the method's randomness)
        RANDOMIZED=_registry.names(randomized=True),
    )


def __getattr__(name):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _lists()[name]


def __dir__():
    return sorted(set(globals()) | set(__all__))
